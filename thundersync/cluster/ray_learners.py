"""The learner ranks as Ray actors, reached over the Redis Streams bus.

`tsrl train --ray ADDRESS` places the learner (which owns the model, optimizer and checkpoints)
on Ray workers, one actor per rank with `learner_cpus` CPUs; the driver process keeps the rollout
engines, the agent loop and the sandboxes. A process on another node cannot share the embedded
process bus, so Ray placement always uses Redis Streams (`--redis-url`, reachable from every node).
`RayLearnerHandle` gives the driver the same supervision calls it uses for a local learner
process. With learner GPUs in the config's `placement:` section each rank runs in its own bundle
of the run's placement group (cluster/ray_plan.py plans it, cluster/ray_pg.py reserves it).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from thundersync.bus.factory import BusRef
from thundersync.cluster.ray_pg import (
    RayPlacement,
    active_placement,
    actor_options,
    actor_where,
    free_port_on,
    place,
    release,
    shares_learner_host,
)
from thundersync.cluster.ray_plan import PlacementError, PlacementRole, publish_transport
from thundersync.config import RunConfig
from thundersync.worker.learner_proc import LearnerSpec, learner_main

LEARNER_CPUS = 1.0
RENDEZVOUS_S = 300.0  # rank 0's actor start (imports torch) before it can name its port


def init_ray(address: str) -> None:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster without a token
    if not ray.is_initialized():
        if address == "local":
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)


class _LearnerActor:
    def where(self) -> dict[str, Any]:
        return actor_where()

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: its node's address and a port free there, for every rank's process group."""
        import ray

        host = ray.util.get_node_ip_address()
        return host, free_port_on(host)

    def run(self, spec: LearnerSpec, bus: BusRef, master_addr: str | None = None) -> int:
        import ray

        # the ranks' process group and the weight broadcast rendezvous at rank 0's node, never
        # at 127.0.0.1 (replicas on other nodes join the broadcast there)
        os.environ["MASTER_ADDR"] = master_addr or ray.util.get_node_ip_address()
        learner_main(spec, bus)
        return 0


def prepare_ray_run(cfg: RunConfig, address: str) -> tuple[RunConfig, str]:
    """Reserve the run's placement before anything starts and fix the publish transport from
    it (cluster/ray_plan.py `publish_transport`); returns the config to run and a log line."""
    from thundersync.config import revalidate

    init_ray(address)
    placement = place(cfg, learner_cpus=LEARNER_CPUS)
    same = shares_learner_host(placement)
    transport = publish_transport(cfg, same_host=same)
    out = cfg.model_copy(deep=True)
    out.publish.transport = transport
    where = "on learner rank 0's node" if same else "on other nodes than learner rank 0"
    return revalidate(out), f"publish: {transport.value} (rollout replicas {where})"


def _last_lines(text: str, n: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def learner_actor_class(cpus: float = 1.0) -> Any:
    import ray

    return ray.remote(num_cpus=cpus)(_LearnerActor)


class RayLearnerHandle:
    """`multiprocessing.Process`-like handle on a learner running as a Ray actor (`actor`: one
    already placed by cluster/ray_pg.py; `master_addr`: rank 0's node, when world > 1)."""

    def __init__(
        self,
        spec: LearnerSpec,
        bus: BusRef,
        address: str,
        cpus: float = 1.0,
        *,
        actor: Any = None,
        master_addr: str | None = None,
    ) -> None:
        import ray

        init_ray(address)
        self._ray = ray
        self.actor: Any = actor if actor is not None else learner_actor_class(cpus).remote()
        self.where_ref: Any = self.actor.where.remote()  # kept: readable after the actor ends
        self.ref: Any = self.actor.run.remote(spec, bus, master_addr)
        self.exitcode: int | None = None
        self.error: str | None = None  # the rank's exception, as Ray reports it

    def start(self) -> None:
        """The actor starts on creation (kept for the Process-like interface)."""

    def is_alive(self) -> bool:
        done, _ = self._ray.wait([self.ref], timeout=0)
        if done and self.exitcode is None:
            try:
                self.exitcode = int(self._ray.get(self.ref))
            except Exception as e:  # over Ray: the run dir may be on another node's disk
                self.exitcode = 1
                self.error = _last_lines(str(e))
        return not done

    def join(self, timeout: float | None = None) -> None:
        self._ray.wait([self.ref], timeout=timeout)
        self.is_alive()

    def terminate(self) -> None:
        self._ray.kill(self.actor)


def start_ray_learners(
    specs: list[LearnerSpec], bus: BusRef, address: str
) -> tuple[list[RayLearnerHandle], RayPlacement | None]:
    """One Ray actor per learner rank (`specs`: `LearnerSpec`s, rank order), each in its GPU
    bundle when the run's config asks for learner GPUs, all rendezvousing at rank 0's node.
    Returns (the rank handles, the `RayPlacement` or None); release it with `release()`."""
    import ray

    init_ray(address)
    cfg = RunConfig.model_validate_json(specs[0].cfg_json)
    cpus = LEARNER_CPUS
    placement = active_placement() or place(cfg, learner_cpus=cpus)  # prepare_ray_run's
    actors: list[Any] = []
    try:
        cls = learner_actor_class()
        for sp in specs:
            opts = actor_options(PlacementRole.LEARNER, sp.rank, cpus=cpus)
            actors.append(cls.options(**opts).remote())
        master: str | None = None
        if len(specs) > 1:
            try:
                master, port = ray.get(actors[0].rendezvous.remote(), timeout=RENDEZVOUS_S)
            except ray.exceptions.GetTimeoutError:
                raise PlacementError(
                    f"learner rank 0 did not start within {RENDEZVOUS_S:g} s: no node has the "
                    f"resources it asks for ({actor_options(PlacementRole.LEARNER, 0, cpus=cpus)})"
                ) from None
            specs = [replace(sp, port=port) for sp in specs]
        handles = [
            RayLearnerHandle(sp, bus, address, actor=a, master_addr=master)
            for sp, a in zip(specs, actors, strict=True)
        ]
    except BaseException:
        for a in actors:
            ray.kill(a)
        release()
        raise
    return handles, placement
