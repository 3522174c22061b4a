"""Distributed plumbing: rank context, cross-rank reduction, and the FSDP2-sharded optimizer.

Why the compute model is a full replica during an update: streaming ranks apply *different*
sources at *different* times. FSDP's per-forward all-gather and per-backward reduce-scatter are
collectives that would put the ranks back in lock-step (one rank idles until the other reaches its
next source), which is exactly the waiting this product removes. theta_k is fixed for the whole
update anyway, so each rank gathers it once per update, accumulates its own sources on the host,
and the only collective is the all-reduce at the barrier. Parameters and AdamW state live sharded
under FSDP2 `fully_shard` (the memory that scales with the optimizer), and the step runs there.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from thundersync.config import OptimConfig


@dataclass(frozen=True)
class ParallelContext:
    rank: int = 0
    world: int = 1
    device_type: str = "cpu"  # "cuda": NCCL, which reduces CUDA tensors only
    bucket_bytes: int = 256 * 2**20  # `learner.reduce_bucket_mb`

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """In place, bucket by bucket (`reduce_bucket`). Each element is still the sum of the
        ranks' values (2 ranks: bit for bit the same)."""
        if not self.distributed:
            return t
        flat = t.view(-1)
        step = max(1, self.bucket_bytes // t.element_size())
        for i in range(0, flat.numel(), step):
            self.reduce_bucket(flat[i : i + step])
        return t

    def reduce_bucket(self, part: torch.Tensor) -> None:
        """Sum one bucket over the ranks in place. A host bucket crosses to the GPU for NCCL and
        comes back, so the GPU holds one bucket, never the whole fp64 sum (8N bytes)."""
        if self.device_type == "cuda" and not part.is_cuda:
            on_gpu = part.to(torch.device("cuda", torch.cuda.current_device()))
            dist.all_reduce(on_gpu, op=dist.ReduceOp.SUM)
            part.copy_(on_gpu)
        else:
            dist.all_reduce(part, op=dist.ReduceOp.SUM)

    def owns(self, index: int) -> bool:
        """Sources are placed on ranks by group / trajectory index, round robin."""
        return index % self.world == self.rank


def init_process_group(
    rank: int, world: int, port: int, device: torch.device | str = "cpu"
) -> ParallelContext:
    """gloo on CPU; on CUDA NCCL for CUDA tensors and gloo for host ones (a host-placed
    optimizer's shards), each rank on GPU `rank % device_count` of its node."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    device_type = torch.device(device).type
    if device_type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    backend = "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world)
    return ParallelContext(rank=rank, world=world, device_type=device_type)


def adamw(params: Sequence[torch.Tensor], cfg: OptimConfig) -> torch.optim.AdamW:
    """The optimiser every update path steps with (the learner's, and SkyRL's as its FSDP
    strategy builds it from `optimizer_config`, for the comparisons)."""
    return torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        foreach=False,
    )


def master_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """The dtype the optimizer steps in: fp32 for 16-bit compute (App. G), else the same."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


class StepOptimizer(Protocol):
    master: list[torch.Tensor]  # full-size theta as the step updates it (read for checkpoints)
    step_dtype: torch.dtype  # what the step's weights and moments are kept in (fp32 for bf16)

    def step(self, grads: Sequence[torch.Tensor]) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class LocalOptimizer:
    """One process: AdamW on the trainable parameters, or on fp32 master copies of them when the
    model computes in bf16 (the step and its moments in fp32; the model gets the rounded copy).
    `device`: where the masters and moments live and the step runs (None: the parameters')."""

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        cfg: OptimConfig,
        device: torch.device | None = None,
    ) -> None:
        self.params = list(params)

        def master(p: nn.Parameter) -> torch.Tensor:
            dtype, where = master_dtype_for(p.dtype), device or p.device
            if dtype == p.dtype and torch.device(where) == p.device:
                return p
            return nn.Parameter(p.detach().to(device=where, dtype=dtype, copy=True))

        self.master: list[torch.Tensor] = [master(p) for p in self.params]
        self.opt = adamw(self.master, cfg)
        self.step_dtype = self.master[0].dtype

    def step(self, grads: Sequence[torch.Tensor]) -> None:
        """`grads` are the step's (already clipped: the barrier scales them)."""
        for m, g in zip(self.master, grads, strict=True):
            m.grad = g.to(device=m.device, dtype=m.dtype)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, m in zip(self.params, self.master, strict=True):
                if m is not p:
                    p.copy_(m)

    def state_dict(self) -> dict[str, Any]:
        return {"optim": self.opt.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.opt.load_state_dict(state["optim"])


class FSDP2Optimizer:
    """AdamW on an FSDP2 (`fully_shard`) copy of the model; the step updates the compute replica."""

    def __init__(
        self,
        model: nn.Module,
        params: Sequence[nn.Parameter],
        cfg: OptimConfig,
        ctx: ParallelContext,
        host: bool = False,
    ) -> None:
        """`host`: the fp32 shards, their moments and the step on the host (a gloo mesh)."""
        from torch.distributed.device_mesh import init_device_mesh

        self.ctx = ctx
        self.params = list(params)
        # theta is read from the full replica (the fp32 shards travel in `state_dict`)
        self.master: list[torch.Tensor] = list(self.params)
        self.mesh = init_device_mesh("cpu" if host else ctx.device_type, (ctx.world,))
        master_dtype = master_dtype_for(self.params[0].dtype)
        # the step gradient reaches the fp32 shards in fp32: narrowing it to the bf16 replica's
        # dtype first rounded every 2-rank bf16 step (0.07 of an update apart from 1 rank)
        self.step_dtype = master_dtype
        self.shadow = _sharded_copy(model, master_dtype, self.mesh)
        trainable = {id(p) for p in self.params}
        self.names = [n for n, p in model.named_parameters() if id(p) in trainable]
        shadow_params = dict(self.shadow.named_parameters())
        self.sharded: list[Any] = [shadow_params[n] for n in self.names]  # DTensor parameters
        self.opt = adamw(self.sharded, cfg)

    def step(self, grads: Sequence[torch.Tensor]) -> None:
        from torch.distributed.tensor import distribute_tensor

        for sp, g in zip(self.sharded, grads, strict=True):
            # every rank holds the same reduced gradient: shard it locally, no communication
            sp.grad = distribute_tensor(
                g.to(device=sp.device, dtype=sp.dtype),
                self.mesh,
                sp.placements,
                src_data_rank=None,
            )
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, sp in zip(self.params, self.sharded, strict=True):
                p.copy_(sp.full_tensor())

    def state_dict(self) -> dict[str, Any]:
        local = {
            str(i): {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in s.items()}
            for i, s in enumerate(self.opt.state[p] for p in self.sharded)
        }
        shards = [sp.to_local().to("cpu", copy=True) for sp in self.sharded]  # not on the GPU
        return {"rank": self.ctx.rank, "world": self.ctx.world, "state": local, "shards": shards}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from torch.distributed.tensor import DTensor

        if state["world"] != self.ctx.world or state["rank"] != self.ctx.rank:
            raise ValueError(
                f"checkpoint was written by rank {state['rank']} of {state['world']}; resume with "
                f"learner.ranks={state['world']}"
            )
        with torch.no_grad():
            for sp, shard in zip(self.sharded, state["shards"], strict=True):
                sp.to_local().copy_(shard)
        for i, sp in enumerate(self.sharded):
            saved = state["state"][str(i)]
            if not saved:
                continue
            restored = {}
            for k, v in saved.items():
                if k == "step":
                    restored[k] = v.clone()
                else:
                    # checkpoints load onto the host: the moments go back to the shard's device
                    local = v.to(sp.to_local().device, copy=True)
                    restored[k] = DTensor.from_local(
                        local, self.mesh, sp.placements, shape=sp.shape, stride=sp.stride()
                    )
            self.opt.state[sp] = restored
        with torch.no_grad():
            for p, sp in zip(self.params, self.sharded, strict=True):
                p.copy_(sp.full_tensor())

    def sharded_state(self) -> dict[str, Any]:
        """The live master shards and AdamW state as DTensors under flat keys (`master/{name}`,
        `optim/{name}/{exp_avg|exp_avg_sq|step}`), for DCP: each rank writes only its shards and a
        load fills them in place, resharded by global shape. Before the first step the state is
        created as AdamW would create it (zeros, step 0), so every checkpoint has the same keys."""
        out: dict[str, Any] = {}
        for name, sp in zip(self.names, self.sharded, strict=True):
            state = self.opt.state[sp]
            if not state:  # AdamW's own first-step init (non-capturable: a host scalar step)
                f64 = torch.get_default_dtype() == torch.float64
                step_dtype = torch.float64 if f64 else torch.float32
                state["step"] = torch.tensor(0.0, dtype=step_dtype, device="cpu")
                state["exp_avg"] = torch.zeros_like(sp, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(sp, memory_format=torch.preserve_format)
            out[f"master/{name}"] = sp
            out.update({f"optim/{name}/{k}": v for k, v in state.items()})
        return out

    def load_sharded_state(self, state: dict[str, Any]) -> None:
        """Take `state` (keys of `sharded_state()`; DCP usually loaded it into these very
        tensors), then refresh the compute replica from the master as `load_state_dict` does."""
        live = self.sharded_state()
        with torch.no_grad():
            for key, dst in live.items():
                if state[key] is not dst:
                    dst.copy_(state[key])
            for p, sp in zip(self.params, self.sharded, strict=True):
                p.copy_(sp.full_tensor())


def _sharded_copy(model: nn.Module, dtype: torch.dtype, mesh: Any) -> nn.Module:
    """An FSDP2 copy of `model` in `dtype` (the master shards) that never holds a whole copy.

    The module tree is copied with meta parameters, sharded there, and each rank then fills its
    own shard from the replica one tensor at a time (`distribute_tensor` without communication:
    the same chunks `fully_shard` cuts). Before, a deep copy converted to fp32 was whole until
    sharded: 4N bytes of start-up transient per GPU (2N + the fp32 copy at 8B: 49 GB).
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor

    params = dict(model.named_parameters())
    memo: dict[int, Any] = {
        id(p): nn.Parameter(torch.empty_like(p, device="meta", dtype=dtype), p.requires_grad)
        for p in params.values()
    }
    shadow = copy.deepcopy(model, memo)  # buffers are copied (small); tied weights stay tied
    layers = getattr(getattr(shadow, "model", None), "layers", None)
    for layer in layers or []:
        fully_shard(layer, mesh=mesh)
    fully_shard(shadow, mesh=mesh)
    device = torch.device(mesh.device_type)
    if device.type == "cuda":
        device = next(iter(params.values())).device
    buffers = {n: b.detach().clone() for n, b in shadow.named_buffers()}
    shadow.to_empty(device=device)
    with torch.no_grad():
        for name, b in shadow.named_buffers():
            b.copy_(buffers[name])
        for name, sp in shadow.named_parameters():  # DTensors now
            local: Any = sp
            full = params[name].detach().to(dtype)
            own = distribute_tensor(full, mesh, local.placements, src_data_rank=None)
            local.to_local().copy_(own.to_local())
    return shadow
