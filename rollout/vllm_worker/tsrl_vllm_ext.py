"""A vLLM worker extension (`--worker-extension-cls tsrl_vllm_ext.TsrlWeightExtension`) that
loads a published policy version from shared memory in place, layer by layer.

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
