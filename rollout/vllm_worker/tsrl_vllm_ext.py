"""A vLLM worker extension (`--worker-extension-cls tsrl_vllm_ext.TsrlWeightExtension`) that
loads a published policy version in place, layer by layer: from shared memory (`tsrl_load_shm`)
or from a gloo / NCCL broadcast by learner rank 0 (`tsrl_load_broadcast`, the format of
rollout/weight_broadcast.py).

This file runs inside vLLM's own venv (its torch, not ours), put on its path by
rollout/vllm_server.py, so it imports nothing from this project: it reads the segment format
written by rollout/weight_wire.py (a byte file plus a JSON index of name, dtype, shape, offset,
nbytes). Called through `POST /collective_rpc {"method": "tsrl_load_shm", ...}`: every worker of
the replica (each tensor-parallel rank) maps the same bytes and lets vLLM's in-place reload
shard them, so a replica costs one memory read of theta, with no file parse and no disk.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Iterator
from typing import Any

import torch

_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}


class TsrlWeightExtension:
    """Mixed into vLLM's worker class: `self.model_runner.model` is the served model."""

    model_runner: Any

    def tsrl_load_shm(self, uri: str, version: int | None = None) -> dict[str, Any]:
        path = uri.removeprefix("shm://")
        with open(path + ".json") as f:
            index = json.load(f)
        if version is not None and index["version"] != int(version):
            raise ValueError(f"{path} holds version {index['version']}, not {version}")
        with open(path, "rb") as raw:
            mm = mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_COPY)
        count = 0

        def tensors() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for e in index["tensors"]:
                dtype = _DTYPES[e["dtype"]]
                numel = e["nbytes"] // torch.empty((), dtype=dtype).element_size()
                t = torch.frombuffer(mm, dtype=dtype, count=numel, offset=e["offset"])
                count += 1
                yield e["name"], t.view(e["shape"])

        # vLLM's in-place reload: layer by layer (a layer's weights are buffered until it is
        # complete, then re-processed into kernel format), so the segment streams through
        self.model_runner.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the ack must mean the weights are in place
        return {"version": index["version"], "tensors": count, "bytes": index["bytes"]}

    def tsrl_param_info(self) -> list[list[Any]]:
        """(name, shape, dtype, contiguous) of every served parameter (diagnostics)."""
        return [
            [n, list(p.shape), str(p.dtype), p.is_contiguous()]
            for n, p in self.model_runner.model.named_parameters()
        ]

    def tsrl_load_broadcast(self, uri: str, version: int, rank_offset: int) -> dict[str, Any]:
        """Join version `version`'s group as rank `rank_offset` + this worker's tensor-parallel
        rank and receive the weights bucket by bucket straight into vLLM's in-place reload
        (NCCL into GPU buffers when the learner sends from CUDA, else gloo)."""
        from datetime import timedelta
        from urllib.parse import parse_qs, urlparse

        import torch.distributed as dist

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
        return {"version": index["version"], "tensors": count, "bytes": sum(index["buckets"])}
