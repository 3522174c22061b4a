"""Which GPUs each role gets on Ray: a pure plan from the run config and the cluster's nodes.

A plan is the list of placement-group bundles and, for every learner rank, rollout replica and
teacher replica, the bundle it runs in (bundle i is slot i). It imports no Ray, so every check
runs against plain node descriptions and an impossible request fails before any actor starts,
with the numbers needed to fix it. cluster/ray_pg.py turns a plan into a placement group. All GPU
counts 0 gives an empty plan: no placement group, CPU actors as without one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from thundersync.config import (
    LOSSLESS_SCHEDULES,
    Objective,
    PlacementStrategy,
    RolloutEngine,
    RunConfig,
    WeightTransport,
)


class PlacementError(ValueError):
    """A placement the cluster cannot give, phrased for the user: the field, the numbers, the fix."""


class PlacementRole(StrEnum):
    LEARNER = "learner"
    ROLLOUT = "rollout"
    TEACHER = "teacher"


# the field that sets a role's GPUs per rank / replica, named in errors
_SIZE_FIELD = {
    PlacementRole.LEARNER: "learner.ranks",
    PlacementRole.ROLLOUT: "rollout.vllm.tensor_parallel_size",
    PlacementRole.TEACHER: "placement.teacher_tp",
}


@dataclass(frozen=True)
class NodeResources:
    node_id: str
    ip: str
    gpus: float
    cpus: float


def nodes_from_ray(nodes: Iterable[Mapping[str, Any]]) -> list[NodeResources]:
    """The alive nodes of `ray.nodes()` (their total resources)."""
    out = []
    for n in nodes:
        if n.get("Alive", True):
            res = n.get("Resources", {})
            gpus, cpus = float(res.get("GPU", 0)), float(res.get("CPU", 0))
            out.append(NodeResources(str(n["NodeID"]), str(n["NodeManagerAddress"]), gpus, cpus))
    return out


@dataclass(frozen=True)
class Slot:
    """One learner rank or engine replica and the bundle it runs in."""

    role: PlacementRole
    index: int  # learner rank or replica index
    bundle: int  # index of its bundle in the placement group
    gpus: int
    cpus: float

    @property
    def bundle_resources(self) -> dict[str, float]:
        res = {"GPU": float(self.gpus), "CPU": float(self.cpus)}
        return {k: v for k, v in res.items() if v > 0}  # Ray refuses zero-sized entries


@dataclass(frozen=True)
class PlacementPlan:
    strategy: PlacementStrategy
    slots: tuple[Slot, ...] = ()

    @property
    def enabled(self) -> bool:
        return bool(self.slots)

    @property
    def bundles(self) -> list[dict[str, float]]:
        return [s.bundle_resources for s in self.slots]

    @property
    def gpus(self) -> int:
        return sum(s.gpus for s in self.slots)

    def of(self, role: PlacementRole) -> list[Slot]:
        return [s for s in self.slots if s.role is role]

    def slot(self, role: PlacementRole, index: int) -> Slot | None:
        return next((s for s in self.slots if s.role is role and s.index == index), None)

    def describe(self) -> str:
        if not self.enabled:
            return "placement: CPU actors (no GPUs asked for)"
        parts = []
        for role in PlacementRole:
            ss = self.of(role)
            if ss:
                unit = "rank" if role is PlacementRole.LEARNER else "replica"
                span = f"{ss[0].bundle}-{ss[-1].bundle}" if len(ss) > 1 else f"{ss[0].bundle}"
                parts.append(f"{role} {len(ss)} {unit}(s) x {ss[0].gpus} GPU (bundles {span})")
        return f"placement group {self.strategy.value}, {self.gpus} GPUs: " + ", ".join(parts)


def role_demands(cfg: RunConfig) -> list[tuple[PlacementRole, int, int]]:
    """(role, ranks or replicas, GPUs each) for every role given GPUs, checked against the
    fields that fix those counts elsewhere in the config."""
    p, out = cfg.placement, []
    if p.learner_gpus:
        ranks = cfg.learner.ranks
        if p.learner_gpus != ranks:
            raise PlacementError(
                f"placement.learner_gpus={p.learner_gpus} with learner.ranks={ranks}: each "
                f"learner rank computes on one GPU, so set placement.learner_gpus to {ranks} "
                f"(or learner.ranks to {p.learner_gpus})"
            )
        out.append((PlacementRole.LEARNER, ranks, 1))
    if p.rollout_gpus and cfg.rollout.vllm.urls:
        raise PlacementError(
            f"placement.rollout_gpus={p.rollout_gpus} reserves GPUs for rollout replicas, but "
            "with rollout.vllm.urls the run attaches to running servers and starts none: set "
            "placement.rollout_gpus to 0"
        )
    if p.rollout_gpus:
        vllm = cfg.rollout.engine is RolloutEngine.VLLM
        tp = cfg.rollout.vllm.tensor_parallel_size if vllm else 1
        replicas = cfg.rollout.replicas
        if p.rollout_gpus != replicas * tp:
            how = "" if vllm else " (rollout.engine hf: one GPU per replica)"
            raise PlacementError(
                f"placement.rollout_gpus={p.rollout_gpus} but rollout.replicas x tensor-parallel "
                f"size = {replicas} x {tp} = {replicas * tp}{how}: set placement.rollout_gpus "
                f"to {replicas * tp} (or 0 for CPU replicas)"
            )
        out.append((PlacementRole.ROLLOUT, replicas, tp))
    if p.teacher_gpus:
        if cfg.objective is not Objective.OPD:
            raise PlacementError(
                f"placement.teacher_gpus={p.teacher_gpus} but objective {cfg.objective.value} "
                "has no teacher: set placement.teacher_gpus to 0"
            )
        replicas = p.teacher_gpus // p.teacher_tp
        if cfg.teacher.backend != "vllm" and (replicas, p.teacher_tp) != (1, 1):
            raise PlacementError(
                f"placement.teacher_gpus={p.teacher_gpus} (teacher_tp={p.teacher_tp}) with "
                f"teacher.backend {cfg.teacher.backend}: the HF teacher is one replica on one "
                "GPU, so set placement.teacher_gpus to 1 and teacher_tp to 1 "
                "(or teacher.backend vllm for more)"
            )
        out.append((PlacementRole.TEACHER, replicas, p.teacher_tp))
    return out


def plan_placement(
    cfg: RunConfig, nodes: Sequence[NodeResources], *, learner_cpus: float = 1.0
) -> PlacementPlan:
    """The bundles of the run's GPU roles and who runs in which; `PlacementError` when the
    cluster (`nodes`, e.g. `nodes_from_ray(ray.nodes())`) cannot hold them."""
    slots: list[Slot] = []
    for role, count, gpus in role_demands(cfg):
        cpus = learner_cpus if role is PlacementRole.LEARNER else 0.0  # as the actors ask
        base = len(slots)
        slots.extend(Slot(role, i, base + i, gpus, cpus) for i in range(count))
    plan = PlacementPlan(cfg.placement.strategy, tuple(slots))
    if plan.enabled:
        check_fits(plan, nodes, cfg.placement.gpus_per_node)
    return plan


def _summary(nodes: Sequence[NodeResources]) -> str:
    if not nodes:
        return "no alive nodes"
    per = " + ".join(f"{n.gpus:g}" for n in nodes)
    return f"{len(nodes)} node(s) with {per} GPUs"


def check_fits(
    plan: PlacementPlan, nodes: Sequence[NodeResources], gpus_per_node: int | None = None
) -> None:
    """Refuse what Ray could never place (a placement group that cannot fit waits forever)."""
    cluster = _summary(nodes)
    largest = max((n.gpus for n in nodes), default=0.0)
    if gpus_per_node is not None and gpus_per_node > largest:
        raise PlacementError(
            f"placement.gpus_per_node={gpus_per_node} but the largest node has {largest:g} GPUs "
            f"({cluster}): lower placement.gpus_per_node or leave it unset"
        )
    caps = [(min(n.gpus, gpus_per_node or n.gpus), n.cpus) for n in nodes]
    have = sum(g for g, _ in caps)
    if plan.gpus > have:
        asked = " + ".join(f"{r}_gpus={sum(s.gpus for s in plan.of(r))}" for r in _roles(plan))
        raise PlacementError(
            f"placement asks for {plan.gpus} GPUs ({asked}) but the cluster offers {have:g} "
            f"({cluster}): lower placement.learner_gpus / rollout_gpus / teacher_gpus or add "
            "GPU nodes"
        )
    cap = max((g for g, _ in caps), default=0.0)
    big = max(plan.slots, key=lambda s: s.gpus)
    if big.gpus > cap:
        unit = "rank" if big.role is PlacementRole.LEARNER else "replica"
        raise PlacementError(
            f"one {big.role} {unit} needs {big.gpus} GPUs on one node but a node offers at most "
            f"{cap:g} ({cluster}): lower {_SIZE_FIELD[big.role]}"
        )
    strategy = plan.strategy
    if strategy is PlacementStrategy.STRICT_PACK:
        fits = any(g >= plan.gpus and c >= sum(s.cpus for s in plan.slots) for g, c in caps)
        if not fits:
            raise PlacementError(
                f"placement.strategy STRICT_PACK puts every bundle on one node, but the plan "
                f"needs {plan.gpus} GPUs and a node offers at most {cap:g} ({cluster}): use "
                "PACK or SPREAD, or fewer GPUs"
            )
    elif strategy is PlacementStrategy.STRICT_SPREAD:
        if not _spread_fits(plan.slots, caps):
            raise PlacementError(
                f"placement.strategy STRICT_SPREAD puts each of the {len(plan.slots)} bundles on "
                f"its own node ({cluster}): use PACK or SPREAD, or fewer ranks / replicas"
            )
    elif not _pack_fits(plan.slots, caps):
        need = ", ".join(f"{s.gpus}" for s in sorted(plan.slots, key=lambda s: -s.gpus))
        raise PlacementError(
            f"the bundles ({need} GPUs) do not fit on the nodes ({cluster}, "
            f"gpus_per_node={gpus_per_node}): a replica's GPUs share one node, so lower "
            "rollout.vllm.tensor_parallel_size / placement.teacher_tp or add GPU nodes"
        )


def _roles(plan: PlacementPlan) -> list[PlacementRole]:
    return [r for r in PlacementRole if plan.of(r)]


def _pack_fits(slots: Sequence[Slot], caps: Sequence[tuple[float, float]]) -> bool:
    """First fit, largest bundle first (Ray's own packing may still differ: this is the check)."""
    free = [list(c) for c in caps]
    for s in sorted(slots, key=lambda s: (-s.gpus, -s.cpus)):
        node = next((f for f in free if f[0] >= s.gpus and f[1] >= s.cpus), None)
        if node is None:
            return False
        node[0] -= s.gpus
        node[1] -= s.cpus
    return True


def _spread_fits(slots: Sequence[Slot], caps: Sequence[tuple[float, float]]) -> bool:
    """One bundle per node: the i-th largest bundle on the i-th largest node."""
    if len(slots) > len(caps):
        return False
    need = sorted(((s.gpus, s.cpus) for s in slots), reverse=True)
    have = sorted(caps, reverse=True)
    return all(g <= hg and c <= hc for (g, c), (hg, hc) in zip(need, have, strict=False))


def publish_transport(cfg: RunConfig, *, same_host: bool) -> WeightTransport:
    """The transport the placement allows: shared memory only when every rollout replica is on
    learner rank 0's node; across nodes a vLLM run broadcasts (NCCL / gloo) and an HF engine
    reads a disk checkpoint on the run's shared storage. An explicit `shm` across nodes is
    refused (the replicas would read a segment that is not on their host)."""
    t = cfg.publish.transport
    if t is WeightTransport.SHM and not same_host:
        raise PlacementError(
            "publish.transport=shm but the placement puts rollout replicas on other nodes than "
            "learner rank 0, where its shared memory is not: set publish.transport to auto, "
            "broadcast (vLLM) or disk (shared storage), or placement.strategy to STRICT_PACK"
        )
    if t is not WeightTransport.AUTO:
        return t
    if same_host:
        return WeightTransport.SHM
    vllm = cfg.rollout.engine is RolloutEngine.VLLM
    broadcast = vllm and cfg.schedule in LOSSLESS_SCHEDULES
    return WeightTransport.BROADCAST if broadcast else WeightTransport.DISK
