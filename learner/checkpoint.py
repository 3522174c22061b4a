"""Learner checkpoints: parameters, optimizer state, policy version, RNG.

One rank (`LocalOptimizer`): one torch.save file, written atomically (temp file + rename) so a
learner killed mid-save leaves the previous checkpoint intact. FSDP2 ranks: a sharded DCP
checkpoint (checkpoint_dcp.py), each rank writing its own shards. Either way resuming continues
bit-identically (same parameters, same AdamW moments).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from thundersync.learner.checkpoint_dcp import latest_sharded, load_sharded, save_sharded
from thundersync.learner.parallel import FSDP2Optimizer
from thundersync.learner.trainer import Learner


def checkpoint_path(root: str | Path, rank: int = 0) -> Path:
    return Path(root) / f"learner-rank{rank}.pt"


def checkpoint_version(root: str | Path, ranks: int | None = None) -> int | None:
    """The version a resume continues from, None without a checkpoint. `ranks`: the format
    that many learner ranks load (more than one: FSDP2, sharded); None: the newer of both."""
    versions = []
    sharded = latest_sharded(root) if ranks is None or ranks > 1 else None
    if sharded is not None:
        versions.append(sharded[0])
    path = checkpoint_path(root)
    if (ranks is None or ranks == 1) and path.exists():  # mmap: reads the version, not theta
        state = torch.load(path, weights_only=False, map_location="cpu", mmap=True)
        versions.append(int(state["version"]))
    return max(versions, default=None)


def _rng(learner: Learner) -> dict[str, torch.Tensor]:
    """This process's RNG states (a sharded checkpoint keeps one copy of these: rank 0's)."""
    rng = {"rng": torch.get_rng_state()}
    if learner.device.type == "cuda":
        rng["cuda_rng"] = torch.cuda.get_rng_state()
    return rng


def save_checkpoint(learner: Learner, root: str | Path) -> Path:
    if isinstance(learner.optimizer, FSDP2Optimizer):  # collective: every rank calls it
        return save_sharded(root, learner.version, learner.optimizer, extra=_rng(learner))
    path = checkpoint_path(root, learner.ctx.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(learner.state_dict(), tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(learner: Learner, root: str | Path) -> int:
    if isinstance(learner.optimizer, FSDP2Optimizer):  # collective; any number of ranks
        rng = _rng(learner)  # fresh copies of the current state, filled in place where saved
        learner.version = load_sharded(root, learner.optimizer, extra=rng)
        torch.set_rng_state(rng["rng"])
        if "cuda_rng" in rng:
            torch.cuda.set_rng_state(rng["cuda_rng"])
        return learner.version
    path = checkpoint_path(root, learner.ctx.rank)
    if not path.exists():
        raise FileNotFoundError(
            f"no learner checkpoint at {path}: check run_dir / checkpoint_every"
        )
    # tensors land on the host first; the learner copies them onto its device
    learner.load_state_dict(torch.load(path, weights_only=False, map_location="cpu"))
    return learner.version
