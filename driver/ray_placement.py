"""Ray placement: the learner as a Ray actor, reached over the Redis Streams bus.

`tsrl train --ray ADDRESS` places the learner (which owns the model, optimizer and checkpoints)
on a Ray worker with `learner_cpus` CPUs; the driver process keeps the rollout engines, the agent
loop and the sandboxes. A process on another node cannot share the embedded process bus, so Ray
placement always uses Redis Streams (`--redis-url`, reachable from every node). The handle below
gives the driver the same supervision calls it uses for a local learner process.
"""

from __future__ import annotations

from typing import Any

from driver.learner_proc import BusRef, LearnerSpec, learner_main


class _LearnerActor:
    def run(self, spec: LearnerSpec, bus: BusRef) -> int:
        learner_main(spec, bus)
        return 0


class RayLearnerHandle:
    """`multiprocessing.Process`-like handle on a learner running as a Ray actor."""

    def __init__(self, spec: LearnerSpec, bus: BusRef, address: str, cpus: float = 1.0) -> None:
        import os

        import ray

        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local cluster without a token
        if not ray.is_initialized():
            if address == "local":
                ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        self._ray = ray
        actor_cls: Any = ray.remote(num_cpus=cpus)(_LearnerActor)
        self.actor: Any = actor_cls.remote()
        self.ref: Any = self.actor.run.remote(spec, bus)
        self.exitcode: int | None = None

    def start(self) -> None:
        """The actor starts on creation (kept for the Process-like interface)."""

    def is_alive(self) -> bool:
        done, _ = self._ray.wait([self.ref], timeout=0)
        if done and self.exitcode is None:
            try:
                self.exitcode = int(self._ray.get(self.ref))
            except Exception:
                self.exitcode = 1
        return not done

    def join(self, timeout: float | None = None) -> None:
        self._ray.wait([self.ref], timeout=timeout)
        self.is_alive()

    def terminate(self) -> None:
        self._ray.kill(self.actor)
