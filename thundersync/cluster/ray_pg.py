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
    plan = plan_placement(cfg, cluster_nodes(), learner_cpus=learner_cpus)
    if not plan.enabled:
        return None
    placement = RayPlacement.create(plan, cfg.placement.ready_timeout_s)
    _ACTIVE.append(placement)
    return placement


def active_placement() -> RayPlacement | None:
    return _ACTIVE[-1] if _ACTIVE else None


def release() -> None:
    """Give back the active placement group (at the run's end; its actors go with it)."""
    while _ACTIVE:
        placement = _ACTIVE.pop()
        with contextlib.suppress(Exception):  # Ray already shut down: the group went with it
            placement.remove()


def actor_options(role: PlacementRole, index: int = 0, *, cpus: float = 0.0) -> dict[str, Any]:
    """Ray actor options of `role`'s rank / replica `index`: its bundle under the active
    placement, else `cpus` CPUs and no GPU (as without a plan)."""
    placement = active_placement()
    return placement.options(role, index, cpus) if placement else {"num_cpus": cpus}


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
        "resources": ctx.get_assigned_resources(),
    }


def free_port_on(host: str) -> int:
    """A port free on `host` (this node's address) at the time of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
