"""Sharded learner checkpoints with torch.distributed.checkpoint (DCP), for FSDP2 ranks.

Each rank writes only its own fp32 master shards and AdamW moments, so a 27B model is never whole
on one rank. DCP records every shard's global offsets: a different number of ranks can load it
(it reshards by global shape). Layout under `root` (the run's checkpoints/ directory):

    learner-dcp-v{k}/   .metadata + one __{rank}_0.distcp per saving rank
    learner-dcp.json    {"version": k, "dir": "learner-dcp-v{k}"}: the checkpoint to resume

The pointer is replaced atomically only after every rank finished writing, so a save killed
midway leaves the previous checkpoint in force; the next save removes the half-written directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

if TYPE_CHECKING:
    from thundersync.learner.parallel import FSDP2Optimizer

POINTER = "learner-dcp.json"
_DIR = re.compile(r"^learner-dcp-v(\d+)$")
_MASTER, _EXTRA = "master/", "extra/"


def dcp_dir_name(version: int) -> str:
    return f"learner-dcp-v{version}"


def latest_sharded(root: str | Path) -> tuple[int, Path] | None:
    """(version, directory) of the checkpoint the pointer names, None without a pointer."""
    pointer = Path(root) / POINTER
    if not pointer.exists():
        return None
    rec = json.loads(pointer.read_text())
    return int(rec["version"]), Path(root) / str(rec["dir"])


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_sharded(
    root: str | Path,
    version: int,
    optimizer: FSDP2Optimizer,
    extra: dict[str, torch.Tensor] | None = None,
    keep: int = 1,
) -> Path:
    """Collective: every rank writes its shards of the master, the AdamW moments and steps into
    `root/learner-dcp-v{version}/`; then rank 0 points `learner-dcp.json` at it and removes all
    but the newest `keep` directories. `extra`: replicated tensors (DCP keeps rank 0's copy)."""
    root = Path(root)
    target = root / dcp_dir_name(version)
    current = latest_sharded(root)  # every rank reads the same file: they all agree to refuse
    if current is not None and current[0] == version:
        raise ValueError(f"learner checkpoint v{version} exists already at {current[1]}")
    if _rank() == 0:
        shutil.rmtree(target, ignore_errors=True)  # left by a killed save: never pointed to
        target.mkdir(parents=True)
    _barrier()
    state = optimizer.sharded_state()
    state.update({_EXTRA + k: v for k, v in (extra or {}).items()})
    dcp.save(state, checkpoint_id=target)
    _barrier()  # every rank's shards (and rank 0's .metadata) are on disk before the pointer
    if _rank() == 0:
        _write_pointer(root, version, target.name)
        _prune(root, version, keep)
    _barrier()  # on return the pointer names this save, on every rank
    return target


def _write_pointer(root: Path, version: int, name: str) -> None:
    tmp = root / f".{POINTER}.tmp"
    with open(tmp, "w") as f:
        json.dump({"version": version, "dir": name}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / POINTER)


def _prune(root: Path, current: int, keep: int) -> None:
    """Keep the newest `keep` saves up to `current`; a newer directory is a killed save's."""
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _DIR.match(p.name))]
    kept = sorted((v for v, _ in found if v <= current), reverse=True)[: max(1, keep)]
    for v, path in found:
        if v not in kept:
            shutil.rmtree(path, ignore_errors=True)


def load_sharded(
    root: str | Path, optimizer: FSDP2Optimizer, extra: dict[str, torch.Tensor] | None = None
) -> int:
    """Collective: load the pointer's checkpoint into `optimizer` (any number of ranks) and
    refresh its compute replica; returns the checkpoint's version. `extra`: tensors shaped as
    saved, filled in place where the checkpoint has them."""
    found = latest_sharded(root)
    if found is None:
        raise FileNotFoundError(
            f"no sharded learner checkpoint at {Path(root) / POINTER}: check run_dir / "
            "checkpoint_every"
        )
    version, path = found
    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    state = optimizer.sharded_state()
    missing = [k for k in state if k not in saved]
    if missing:
        raise ValueError(
            f"{path} lacks {missing[:3]}...: it was written for another model or LoRA setting; "
            "resume with the same model.* config"
        )
    targets = dict(state)
    targets.update({_EXTRA + k: v for k, v in (extra or {}).items() if _EXTRA + k in saved})
    dcp.load(targets, checkpoint_id=path)  # in place: DCP copies into each rank's shards
    optimizer.load_sharded_state(state)
    return version


def read_master(root: str | Path) -> dict[str, torch.Tensor]:
    """The whole master (name -> fp32 tensor) of the pointer's checkpoint, read by this one
    process without collectives (a process group may exist or not): for tests and tools."""
    found = latest_sharded(root)
    if found is None:
        raise FileNotFoundError(f"no sharded learner checkpoint at {Path(root) / POINTER}")
    reader = dcp.FileSystemReader(found[1])
    meta = reader.read_metadata().state_dict_metadata
    full = {
        k: torch.empty(tuple(m.size), dtype=m.properties.dtype)
        for k, m in meta.items()
        if k.startswith(_MASTER) and isinstance(m, TensorStorageMetadata)
    }
    with warnings.catch_warnings():  # its "assuming ... a single process" is the intent here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(full, storage_reader=reader, no_dist=True)
    return {k.removeprefix(_MASTER): v for k, v in full.items()}
