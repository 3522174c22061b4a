"""What both objectives' work items run on: the model at theta_k, the sums and the routed backward.

The GRPO groups (`engine_grpo`) and the OPD trajectories (`engine_opd`) each own their open state;
they share this core: the flat layout and buffer pool of the parameter sums, the update's sum they
close into, the routed backward, the counters and the timers. It lives apart from the engine so
that neither objective's file imports the engine (no import cycle).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from thundersync.config import Checkpointing
from thundersync.learner.accumulators import BufferPool, FlatSpec
from thundersync.learner.boundary import KV
from thundersync.learner.logprobs import LogprobMismatch
from thundersync.learner.routing import GradRouter, GradSink, Target
from thundersync.learner.update_sum import UpdateAccumulator


class SourceError(ValueError):
    """A source whose content cannot be applied (wrong shapes, unknown group, ...)."""


def flat_kv(kv_list: list[KV]) -> list[torch.Tensor]:
    return [t for k, v in kv_list for t in (k, v)]


def take_grads(leaves: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """The leaves' accumulated adjoints, reset (leaves are reused by a group's continuations)."""
    out = [x.grad for x in leaves]
    for x in leaves:
        x.grad = None
    return out


class EngineCore:
    """One update's model, parameter sums and backward, shared by its GRPO and OPD work."""

    def __init__(
        self,
        model: nn.Module,
        params: list[nn.Parameter],
        *,
        accum_dtype: torch.dtype,
        accum_device: torch.device | str,
        checkpoint: Checkpointing | bool,
        logprob_chunk: int,
        pool: BufferPool | None,
        router: GradRouter | None,
        kv_limit: int | None = None,
    ) -> None:
        self.model = model
        self.params = params
        self.device = params[0].device if params else torch.device("cpu")
        self.acc_device = torch.device(accum_device)
        self.spec = FlatSpec(params, device=self.acc_device)
        self.dtype = accum_dtype
        self.checkpoint = checkpoint
        self.logprob_chunk = logprob_chunk
        self.kv_limit = kv_limit  # an OPD K/V store grows to this many positions at most
        self.pool = pool or BufferPool(self.acc_device)
        self.router = router or GradRouter(
            params, GradSink(self.spec, self.acc_device, accum_dtype)
        )
        # the update's sum spans groups closing in any order (sync closes them one by one,
        # stream as they finish): fp64 keeps it order-free; one add per group / trajectory close
        self.acc = UpdateAccumulator(self.spec, self.pool, torch.float64)
        self.counters: Counter[str] = Counter()
        self.mismatch = LogprobMismatch()
        # seconds: "backward" includes the routed adds ("host_adds" of them, when the sums live
        # on the host), "bookkeeping" the rest of the vector work
        self.timers: dict[str, float] = {"bookkeeping": 0.0, "backward": 0.0, "host_adds": 0.0}

    @contextmanager
    def bookkeeping(self) -> Iterator[None]:
        """Times the full-parameter vector work (what streaming adds over a plain backward)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.timers["bookkeeping"] += time.perf_counter() - t0

    def backprop(
        self,
        targets: list[Target],
        outs: list[torch.Tensor],
        adj: list[torch.Tensor],
        leaves: list[torch.Tensor],
    ) -> list[torch.Tensor | None]:
        """Push `adj` back through `outs` into the parameter sums `targets`; returns the
        adjoints of `leaves` (earlier K/V). Frozen outputs (LoRA) are skipped."""
        pairs = [
            (o, a.to(device=o.device, dtype=o.dtype))
            for o, a in zip(outs, adj, strict=True)
            if o.requires_grad
        ]
        if not pairs:
            return [None for _ in leaves]
        self.routed_backward(targets, [o for o, _ in pairs], [a for _, a in pairs], leaves=leaves)
        return take_grads(leaves)

    def routed_backward(
        self,
        targets: list[Target],
        outputs: list[torch.Tensor],
        grad_outputs: list[torch.Tensor] | None = None,
        *,
        leaves: list[torch.Tensor],
        retain_graph: bool = False,
    ) -> None:
        """One backward whose parameter gradients go straight into `targets` (in place)."""
        t0, a0 = time.perf_counter(), self.router.add_s
        self.router.backward(
            targets,
            outputs,
            grad_outputs,
            inputs=[*self.params, *leaves],
            retain_graph=retain_graph,
        )
        self.timers["backward"] += time.perf_counter() - t0
        self.timers["host_adds"] += self.router.add_s - a0
