"""Weights by collective broadcast from learner rank 0 to every replica worker: NCCL on CUDA, gloo
on CPU, the same code path (`publish.transport: broadcast`).

Learner rank 0 owns a TCPStore. For each version it puts the index (names, dtypes, shapes, bucket
offsets) in the store under `v<k>/`, publishes `PolicyPublished(uri="bcast://HOST:PORT/k?world=W")`
and broadcasts the weights in buckets (raw bytes, each tensor in its own dtype: bf16 stays bf16)
over a group formed for that version with the W - 1 receivers: every tensor-parallel worker of
every vLLM replica, joined through `/collective_rpc tsrl_load_broadcast` (see
rollout/vllm_worker/tsrl_vllm_ext.py, which reads the same index; keep the two in step). A fresh
group per version (a prefix of the one store) means a restarted replica simply joins the next one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch
import torch.distributed as dist

SCHEME = "bcast://"
BUCKET_BYTES = 256 << 20
_NAMES = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float64: "float64",
}


@dataclass(frozen=True)
class BroadcastRef:
    host: str
    port: int
    version: int
    world: int  # learner rank 0 + every receiving worker

    @property
    def uri(self) -> str:
        return f"{SCHEME}{self.host}:{self.port}/{self.version}?world={self.world}"

    @classmethod
    def parse(cls, uri: str) -> BroadcastRef:
        u = urlparse(uri)
        if u.scheme != "bcast" or u.hostname is None or u.port is None:
            raise ValueError(f"not a broadcast weight uri: {uri!r} (want {SCHEME}HOST:PORT/V)")
        world = int(parse_qs(u.query)["world"][0])
        return cls(u.hostname, u.port, int(u.path.strip("/")), world)


def is_broadcast_uri(source: object) -> bool:
    return isinstance(source, str) and source.startswith(SCHEME)


def plan_buckets(
    state_dict: Mapping[str, torch.Tensor], bucket_bytes: int | None = None
) -> dict[str, Any]:
    """The index: every tensor's bucket and byte range (64-byte aligned, so any dtype can view
    it); a bucket closes past `bucket_bytes` (default `BUCKET_BYTES`)."""
    limit = bucket_bytes or BUCKET_BYTES
    entries: list[dict[str, Any]] = []
    sizes: list[int] = [0]
    for name, t in state_dict.items():
        if t.dtype not in _NAMES:
            raise ValueError(f"tensor {name!r} has dtype {t.dtype}: not publishable")
        nbytes = t.numel() * t.element_size()
        sizes[-1] = -(-sizes[-1] // 64) * 64
        if sizes[-1] and sizes[-1] + nbytes > limit:
            sizes.append(0)
        entries.append(
            {
                "name": name,
                "dtype": _NAMES[t.dtype],
                "shape": list(t.shape),
                "bucket": len(sizes) - 1,
                "offset": sizes[-1],
                "nbytes": nbytes,
            }
        )
        sizes[-1] += nbytes
    return {"buckets": sizes, "tensors": entries}


def _group(store: Any, rank: int, world: int, backend: str, timeout: timedelta) -> Any:
    """A group of its own (never the default one: vLLM's workers already have theirs)."""
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world, opts)
    return dist.ProcessGroupGloo(store, rank, world, timeout)


class WeightBroadcaster:
    """Learner rank 0's side. `announce` stores the index and returns the uri to publish; `send`
    then blocks until every receiver has every bucket (the engines' acks follow)."""

    def __init__(self, receivers: int, *, host: str | None = None, timeout_s: float = 300) -> None:
        from thundersync.rollout.vllm_server import free_port

        self.receivers = receivers
        self.host = host or os.environ.get("MASTER_ADDR") or "127.0.0.1"
        self.port = free_port()
        self.timeout = timedelta(seconds=timeout_s)
        self.store = dist.TCPStore(
            self.host, self.port, is_master=True, wait_for_workers=False, timeout=self.timeout
        )

    def announce(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> str:
        index = plan_buckets(state_dict)
        on_cuda = any(t.is_cuda for t in state_dict.values())
        index |= {"version": version, "backend": "nccl" if on_cuda else "gloo"}
        dist.PrefixStore(f"v{version}/", self.store).set("index", json.dumps(index))
        return BroadcastRef(self.host, self.port, version, 1 + self.receivers).uri

    def send(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        ps = dist.PrefixStore(f"v{version}/", self.store)
        index = json.loads(ps.get("index"))
        pg = _group(ps, 0, 1 + self.receivers, index["backend"], self.timeout)
        tensors = list(state_dict.values())
        device = tensors[0].device if index["backend"] == "nccl" else torch.device("cpu")
        for b, size in enumerate(index["buckets"]):
            buf = torch.empty(size, dtype=torch.uint8, device=device)
            for e, t in zip(index["tensors"], tensors, strict=True):
                if e["bucket"] == b and e["nbytes"]:
                    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
                    buf[e["offset"] : e["offset"] + e["nbytes"]].copy_(raw)
            pg.broadcast(buf, 0).wait()
        ps.delete_key("index")

    def close(self) -> None:
        del self.store


def receive(uri: str, rank: int, timeout_s: float = 300) -> Iterator[tuple[str, torch.Tensor]]:
    """A receiver on the CPU, for tests (the vLLM extension has its own copy: it cannot import
    this package): (name, tensor) per published tensor, bucket by bucket."""
    ref = BroadcastRef.parse(uri)
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(ref.host, ref.port, is_master=False, timeout=timeout)
    ps = dist.PrefixStore(f"v{ref.version}/", store)
    index = json.loads(ps.get("index"))
    pg = _group(ps, rank, ref.world, "gloo", timeout)
    dtypes = {v: k for k, v in _NAMES.items()}
    for b, size in enumerate(index["buckets"]):
        buf = torch.empty(size, dtype=torch.uint8)
        pg.broadcast(buf, 0).wait()
        for e in index["tensors"]:
            if e["bucket"] == b:
                raw = buf[e["offset"] : e["offset"] + e["nbytes"]]
                yield e["name"], raw.view(dtypes[e["dtype"]]).view(e["shape"])
