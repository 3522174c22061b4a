"""Ray plumbing of a placement plan: the placement group, each actor's options, where it runs.

`place(cfg)` plans against the live cluster (cluster/ray_plan.py), reserves one placement group
and makes it the driver's active placement; `actor_options(role, index)` then gives any actor
of that role its bundle and `num_gpus` (and plain CPU options without a plan, as before), so the
engine and teacher actors created later by the driver land in their bundles without being handed
the plan. The learner ranks are started in cluster/ray_learners.py.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Mapping
from typing import Any

from thundersync.cluster.ray_plan import (
    NodeResources,
    PlacementError,
    PlacementPlan,
    PlacementRole,
    nodes_from_ray,
    plan_placement,
)
from thundersync.config import RunConfig

_ACTIVE: list[RayPlacement] = []  # the driver's placement (one run per driver process)
# every actor's env: a dead NCCL peer raises instead of hanging the barrier, warnings reach logs
ACTOR_ENV = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_DEBUG": "WARN"}
_ENV: dict[str, str] = {}  # the run's actor env, set by `place`


class RayPlacement:
    """A plan and the placement group that reserves its bundles."""

    def __init__(self, plan: PlacementPlan, pg: Any) -> None:
        self.plan = plan
        self.pg = pg

    @classmethod
    def create(cls, plan: PlacementPlan, timeout_s: float) -> RayPlacement:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        pg = placement_group(plan.bundles, strategy=plan.strategy.value)
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(pg)
            free = ray.available_resources().get("GPU", 0.0)
            raise PlacementError(
                f"Ray did not reserve the {plan.describe()} within {timeout_s:g} s; "
                f"{free:g} GPUs are free now (other jobs may hold the rest): free them or raise "
                "placement.ready_timeout_s"
            ) from None
        return cls(plan, pg)

    def options(self, role: PlacementRole, index: int, cpus: float) -> dict[str, Any]:
        slot = self.plan.slot(role, index)
        if slot is None:
            return {"num_cpus": cpus}
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "num_cpus": slot.cpus,
            "num_gpus": slot.gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.pg, placement_group_bundle_index=slot.bundle
            ),
        }

    def to_json(self) -> dict[str, Any]:
        """The plan as the run dir records it: each role's bundle, GPUs and node."""
        nodes = self.bundle_nodes()
        return {
            "kind": "ray",
            "strategy": self.plan.strategy.value,
            "slots": [
                {
                    "role": s.role.value,
                    "index": s.index,
                    "bundle": s.bundle,
                    "gpus": s.gpus,
                    "node_id": nodes.get(s.bundle),
                }
                for s in self.plan.slots
            ],
        }

    def bundle_nodes(self) -> dict[int, str]:
        """Bundle index -> the node id Ray placed it on."""
        from ray.util import placement_group_table

        return {
            int(k): str(v) for k, v in placement_group_table(self.pg)["bundles_to_node_id"].items()
        }

    def remove(self) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.pg)  # kills the actors still in it


def cluster_nodes() -> list[NodeResources]:
    import ray

    return nodes_from_ray(ray.nodes())


def place(cfg: RunConfig, *, learner_cpus: float = 1.0) -> RayPlacement | None:
    """Plan on the live cluster and reserve it; None (CPU actors) when no role asks for GPUs.
    Raises `PlacementError` before any actor exists when the cluster cannot hold the plan."""
    release()
    _ENV.clear()
    _ENV.update(actor_env(cfg, os.environ))
    plan = plan_placement(cfg, cluster_nodes(), learner_cpus=learner_cpus)
    if not plan.enabled:
        return None
    placement = RayPlacement.create(plan, cfg.placement.ready_timeout_s)
    _ACTIVE.append(placement)
    return placement


def shares_learner_host(placement: RayPlacement | None) -> bool:
    """Whether every rollout replica runs on learner rank 0's node: a one-node cluster, or both
    roles in bundles of that node. CPU actors go where Ray puts them: not known, so False."""
    nodes = cluster_nodes()
    if len(nodes) <= 1:
        return True
    if placement is None:
        return False
    learner, rollout = (
        placement.plan.slot(PlacementRole.LEARNER, 0),
        placement.plan.of(PlacementRole.ROLLOUT),
    )
    if learner is None or not rollout:
        return False
    where = placement.bundle_nodes()
    return all(where[s.bundle] == where[learner.bundle] for s in rollout)


def active_placement() -> RayPlacement | None:
    return _ACTIVE[-1] if _ACTIVE else None


def release() -> None:
    """Give back the active placement group (at the run's end; its actors go with it)."""
    while _ACTIVE:
        placement = _ACTIVE.pop()
        with contextlib.suppress(Exception):  # Ray already shut down: the group went with it
            placement.remove()


def actor_env(cfg: RunConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """The defaults, then the driver's own NCCL_* settings (the cluster's interfaces), then
    `placement.actor_env`: what every actor's runtime env carries to its node."""
    nccl = {k: v for k, v in environ.items() if k.startswith("NCCL_")}
    return {**ACTOR_ENV, **nccl, **cfg.placement.actor_env}


def actor_options(role: PlacementRole, index: int = 0, *, cpus: float = 0.0) -> dict[str, Any]:
    """Ray actor options of `role`'s rank / replica `index`: its bundle under the active
    placement, else `cpus` CPUs and no GPU (as without a plan); the run's actor env either way."""
    placement = active_placement()
    opts: dict[str, Any] = placement.options(role, index, cpus) if placement else {"num_cpus": cpus}
    if _ENV:
        opts["runtime_env"] = {"env_vars": dict(_ENV)}
    return opts


def describe_active() -> str:
    placement = active_placement()
    return placement.plan.describe() if placement else "placement: CPU actors (no GPUs asked for)"


# ---- inside actors ------------------------------------------------------------------------------
def assigned_device() -> str:
    """cuda only when Ray gave this actor a GPU and torch sees one: a fake GPU id (a CPU test
    cluster advertising GPUs) or a CPU build of torch keeps the actor on the CPU."""
    import ray
    import torch

    return "cuda" if ray.get_gpu_ids() and torch.cuda.is_available() else "cpu"


def actor_where() -> dict[str, Any]:
    """Where the calling actor runs: node, GPUs, and what torch makes of them."""
    import ray
    import torch

    ctx = ray.get_runtime_context()
    pg = ctx.get_placement_group_id()
    return {
        "node_id": ctx.get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cuda_available": torch.cuda.is_available(),
        "placement_group": pg,
        "nccl_env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_NCCL_"))},
        "resources": ctx.get_assigned_resources(),
    }


def free_port_on(host: str) -> int:
    """A port free on `host` (this node's address) at the time of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
