"""Which GPUs each process gets on one node without Ray: `CUDA_VISIBLE_DEVICES` per role.

The same role demands as the Ray plan (cluster/ray_plan.py: learner ranks, rollout replicas x
tensor-parallel size, teacher replicas x teacher_tp), laid out over the node's GPUs in that order,
so the paper's GRPO split (4 learner + 4 rollout) is GPUs 0-3 / 4-7 and OPD's (4 + 2 + 2) is 0-3 /
4-5 / 6-7. Ids are the node's own names for its GPUs: when the driver was itself given
`CUDA_VISIBLE_DEVICES=2,3,...` its children get subsets of those. A spawned process (learner
rank, vLLM server) gets the variable; a role inside the driver (HF engine or teacher) gets the
`cuda:i` index of its GPU among the driver's. With no GPUs asked for, every process shares the
node's GPUs as before (`shared`). Pure: no torch, no CUDA call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from thundersync.cluster.ray_plan import PlacementError, PlacementRole, role_demands
from thundersync.config import RunConfig

ENV = "CUDA_VISIBLE_DEVICES"


def node_gpu_ids(environ: Mapping[str, str], device_count: int) -> tuple[str, ...]:
    """The GPUs this process may hand out: its own `CUDA_VISIBLE_DEVICES` when set, else
    `device_count` (what torch sees)."""
    listed = environ.get(ENV)
    if listed is None:
        return tuple(str(i) for i in range(device_count))
    return tuple(x.strip() for x in listed.split(",") if x.strip())


@dataclass(frozen=True)
class ProcessGpus:
    """One learner rank / engine replica and its GPUs (ids as the node names them)."""

    role: PlacementRole
    index: int
    gpus: tuple[str, ...]
    first: int  # position of gpus[0] among the node's ids: the driver's `cuda:first`

    @property
    def env(self) -> dict[str, str]:
        return {ENV: ",".join(self.gpus)}


@dataclass(frozen=True)
class LocalPlan:
    node_gpus: tuple[str, ...]
    slots: tuple[ProcessGpus, ...] = ()

    @property
    def shared(self) -> bool:
        """No role asked for GPUs: every process sees the node's GPUs (as a one-GPU box wants)."""
        return not self.slots

    def of(self, role: PlacementRole, index: int = 0) -> ProcessGpus | None:
        return next((s for s in self.slots if s.role is role and s.index == index), None)

    def env(self, role: PlacementRole, index: int = 0) -> dict[str, str]:
        """The child's `CUDA_VISIBLE_DEVICES` ({} when shared: it inherits the driver's)."""
        slot = self.of(role, index)
        return slot.env if slot else {}

    def driver_index(self, role: PlacementRole) -> int | None:
        """The `cuda:i` of a role that runs inside the driver (HF engine / HF teacher), or None
        when it has no GPUs of its own."""
        slot = self.of(role)
        return slot.first if slot else None

    def describe(self) -> str:
        if self.shared:
            n = len(self.node_gpus)
            return f"placement: one node, {n} GPU(s) shared by every process (none asked for)"
        parts = [f"{s.role} {s.index} -> GPU {','.join(s.gpus)}" for s in self.slots]
        return f"placement: one node, {len(self.node_gpus)} GPU(s): " + "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "local",
            "node_gpus": list(self.node_gpus),
            "shared": self.shared,
            "processes": [
                {"role": s.role.value, "index": s.index, ENV: ",".join(s.gpus)} for s in self.slots
            ],
        }


def plan_local(cfg: RunConfig, node_gpus: tuple[str, ...]) -> LocalPlan:
    """Lay the config's GPU roles over `node_gpus` in order; `PlacementError` naming the fields
    when the node has fewer."""
    demands = role_demands(cfg)
    need = sum(count * each for _, count, each in demands)
    if need > len(node_gpus):
        asked = ", ".join(f"{role}_gpus={count * each}" for role, count, each in demands)
        raise PlacementError(
            f"placement asks for {need} GPUs ({asked}) but this node offers {len(node_gpus)} "
            f"({ENV}={','.join(node_gpus) or 'none'}): lower placement.learner_gpus / "
            "rollout_gpus / teacher_gpus, or run with --ray on a cluster"
        )
    slots, at = [], 0
    for role, count, each in demands:
        for i in range(count):
            slots.append(ProcessGpus(role, i, node_gpus[at : at + each], at))
            at += each
    return LocalPlan(node_gpus, tuple(slots))
