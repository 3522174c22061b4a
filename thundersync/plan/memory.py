"""The learner's memory plan: per-component bytes per GPU, per host and in /dev/shm.

Pure arithmetic over the run config and the model shape (no torch), describing what the code
does today, including what it over-allocates (each checked in the code, file named):
- every learner rank holds the FULL model replica in the compute dtype (`learner/parallel.py`:
  FSDP2 shards only the optimizer's copy);
- FSDP2 (ranks > 1): a copy of the model in fp32, sharded (master shards), its AdamW moments
  sharded, both on the GPU; built on the meta device and filled one tensor at a time (startup);
- one rank (ranks = 1) with a bf16 model: an fp32 master copy and its AdamW moments unsharded
  on the GPU, and the step's fp32 gradient copied to the GPU whole (`LocalOptimizer.step`);
- ranks > 1: the update sum is all-reduced one fp64 `learner.reduce_bucket_mb` bucket at a time
  as the barrier reads it (through the GPU on CUDA, `ParallelContext.reduce_bucket`) and finished
  in its own buffers (`UpdateAccumulator.finish`; clipped into the split sum's second buffer, or
  a new fp32 vector for a one-vector sum); each FSDP2 step copies one full fp32 gradient per
  tensor to the GPU;
- CUDA -> host gradients pass a pinned staging ring (`learner/routing.py`, `ring_numel`);
- a checkpoint copies theta (the bf16 replica under FSDP2, the fp32 master on one rank) to the
  host tensor by tensor (`Learner.state_dict`);
- delta publish keeps a copy of the acked weights on rank 0's GPU (`rollout/weight_delta.py`).
Activations: `plan.activations`. Each phase's transients come on top of what is always held
(`static`); a total is static + the largest phase. The accumulator bytes are the engine's
pooled vectors (2 per open GRPO group, 1 per open OPD trajectory, 2 for the update's sum).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from thundersync.config import Objective, RunConfig
from thundersync.config_serving import RolloutEngine
from thundersync.plan.parts import Component, learner_parts
from thundersync.plan.shape import ModelShape

GB = 10**9
PHASES = ("static", "startup", "update", "reduce", "step", "publish", "checkpoint")


@dataclass(frozen=True)
class Machine:
    gpus: int  # 0: a CPU learner
    gpu_bytes: int | None  # per GPU
    host_bytes: int


@dataclass
class MemoryPlan:
    shape: ModelShape
    machine: Machine
    components: list[Component]
    gpus_needed: int
    rollout_gpu_bytes: int = 0  # a vLLM replica's weights per rollout GPU
    rollout_gpu_cap: float = 0.0  # rollout.vllm.gpu_memory_utilization
    refusal: str | None = None
    notes: list[str] = field(default_factory=list)

    def total(self, where: str) -> int:
        parts = [c for c in self.components if c.where == where]
        static = sum(c.bytes for c in parts if c.phase == "static")
        by_phase = [sum(c.bytes for c in parts if c.phase == p) for p in PHASES[1:]]
        return static + max(by_phase, default=0)

    def peak_phase(self, where: str) -> str:
        parts = [c for c in self.components if c.where == where]
        sums = {p: sum(c.bytes for c in parts if c.phase == p) for p in PHASES[1:]}
        return max(sums, key=lambda p: sums[p]) if any(sums.values()) else "static"

    @property
    def per_gpu_bytes(self) -> int:
        return self.total("gpu")

    @property
    def host_bytes(self) -> int:
        return self.total("host") + self.shm_bytes  # /dev/shm is host memory too

    @property
    def shm_bytes(self) -> int:
        return self.total("shm")

    def overflow(self) -> list[str]:
        """What does not fit, in words (empty when everything fits)."""
        m, out = self.machine, []
        if m.gpus and self.gpus_needed > m.gpus:
            out.append(f"the run needs {self.gpus_needed} GPUs, the machine has {m.gpus}")
        if m.gpus and m.gpu_bytes is not None and self.per_gpu_bytes > m.gpu_bytes:
            out.append(
                f"a learner GPU needs {self.per_gpu_bytes / GB:.1f} GB > {m.gpu_bytes / GB:.1f} "
                f"GB (peak in phase {self.peak_phase('gpu')})"
            )
        cap = self.rollout_gpu_cap * (m.gpu_bytes or 0)
        if m.gpus and m.gpu_bytes and self.rollout_gpu_bytes > cap:
            out.append(
                f"a rollout GPU needs {self.rollout_gpu_bytes / GB:.1f} GB of weights > "
                f"{cap / GB:.1f} GB (gpu_memory_utilization x GPU)"
            )
        if self.host_bytes > m.host_bytes:
            out.append(
                f"the host needs {self.host_bytes / GB:.1f} GB > {m.host_bytes / GB:.1f} GB "
                f"(learner peak in phase {self.peak_phase('host')}, /dev/shm "
                f"{self.shm_bytes / GB:.1f} GB)"
            )
        return out

    @property
    def fits(self) -> bool:
        return not self.overflow()

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.shape.name,
            "params": self.shape.params,
            "gpus": self.machine.gpus,
            "gpus_needed": self.gpus_needed,
            "gpu_memory_bytes": self.machine.gpu_bytes,
            "host_memory_bytes": self.machine.host_bytes,
            "per_gpu_bytes": self.per_gpu_bytes,
            "rollout_gpu_bytes": self.rollout_gpu_bytes,
            "host_bytes": self.host_bytes,
            "shm_bytes": self.shm_bytes,
            "gpu_peak_phase": self.peak_phase("gpu"),
            "host_peak_phase": self.peak_phase("host"),
            "fits": self.fits,
            "refusal": self.refusal,
            "notes": self.notes,
            "components": [c.__dict__ for c in self.components],
        }


def gpus_needed(cfg: RunConfig) -> int:
    """GPUs of the run's roles: the placement's counts, else one per learner rank plus the vLLM
    rollout replicas x tensor-parallel size."""
    p, r = cfg.placement, cfg.rollout
    placed = p.learner_gpus + p.rollout_gpus + p.teacher_gpus
    rollout = r.replicas * r.vllm.tensor_parallel_size if r.engine is RolloutEngine.VLLM else 0
    return max(placed, cfg.learner.ranks + rollout)


def plan_memory(cfg: RunConfig, shape: ModelShape, machine: Machine) -> MemoryPlan:
    """Every component the learner allocates for this config and shape (one learner rank's
    GPU; the host holds all ranks of one node plus the shm slots)."""
    comps = learner_parts(cfg, shape, on_gpu=machine.gpus > 0 and cfg.learner.device != "cpu")
    plan = MemoryPlan(shape, machine, comps, gpus_needed(cfg))
    if cfg.rollout.engine is RolloutEngine.VLLM:
        b = 2 if (cfg.rollout.vllm.dtype or "bfloat16") != "float32" else 4
        plan.rollout_gpu_bytes = shape.params * b // cfg.rollout.vllm.tensor_parallel_size
        plan.rollout_gpu_cap = cfg.rollout.vllm.gpu_memory_utilization
    plan.notes = notes(cfg)
    return plan


def notes(cfg: RunConfig) -> list[str]:
    out = [
        f"host = {cfg.learner.ranks} learner rank(s) on this node + /dev/shm; a vLLM rollout "
        "or teacher server's own host memory is not planned",
        "activations assume the worst split of rollout.max_total_tokens into prompt and "
        "response; GRPO holds each open group's prompt graph until the group closes",
    ]
    ckpt = cfg.learner.activation_checkpointing
    if ckpt == "segment":
        out.append(
            "activation_checkpointing: segment wraps a whole segment: it shrinks the graphs "
            "kept between sources, not one segment's backward (recomputed whole)"
        )
    elif ckpt == "layer":
        out.append(
            "activation_checkpointing: layer keeps each layer's input and own K/V and "
            "recomputes one layer at a time in the backward"
        )
    if cfg.objective is Objective.OPD:
        mode = cfg.learner.opd_turn_graphs
        out.append(f"OPD turn graphs: {mode.value} (auto = recompute on CUDA, keep on CPU)")
    out.append("rewards sent before contents (the driver's order): no held H_i vectors")
    return out
