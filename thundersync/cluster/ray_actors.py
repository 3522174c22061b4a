"""Ray placement: the learner as a Ray actor, reached over the Redis Streams bus.

`tsrl train --ray ADDRESS` places the learner (which owns the model, optimizer and checkpoints)
on a Ray worker with `learner_cpus` CPUs; the driver process keeps the rollout engines, the agent
loop and the sandboxes. A process on another node cannot share the embedded process bus, so Ray
placement always uses Redis Streams (`--redis-url`, reachable from every node). The handle below
gives the driver the same supervision calls it uses for a local learner process. With GPUs in the
config's `placement:` section each learner rank, engine and teacher actor runs in its own bundle
of the run's placement group (driver/ray_plan.py plans it, driver/ray_pg.py reserves it).
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from thundersync.bus.factory import BusRef
from thundersync.driver.learner_proc import LearnerSpec, learner_main


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
        from thundersync.driver.ray_pg import actor_where

        return actor_where()

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0: its node's address and a port free there, for every rank's process group."""
        import ray

        from thundersync.driver.ray_pg import free_port_on

        host = ray.util.get_node_ip_address()
        return host, free_port_on(host)

    def run(self, spec: LearnerSpec, bus: BusRef, master_addr: str | None = None) -> int:
        if master_addr is not None:  # learner.parallel.init_process_group keeps a set MASTER_ADDR
            os.environ["MASTER_ADDR"] = master_addr
        learner_main(spec, bus)
        return 0


def learner_actor_class(cpus: float = 1.0) -> Any:
    import ray

    return ray.remote(num_cpus=cpus)(_LearnerActor)


class RayLearnerHandle:
    """`multiprocessing.Process`-like handle on a learner running as a Ray actor (`actor`: one
    already placed by driver/ray_pg.py; `master_addr`: rank 0's node, when world > 1)."""

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


# ---- rollout engine, teacher and sandbox environments as Ray actors ---------------------------
class _EngineActor:
    def __init__(self, model_dir: str, version: int) -> None:
        import torch

        from thundersync.driver.ray_pg import assigned_device
        from thundersync.rollout.hf_engine import HFEngine

        torch.set_num_threads(1)
        self.engine = HFEngine(model_dir, version=version, device=assigned_device())

    def generate(self, prompt_ids: list[int], params: Any, seed: int, version: int | None) -> Any:
        return self.engine.generate(prompt_ids, params, seed, version=version)

    def load_weights(self, version: int, source: str) -> Any:
        return self.engine.load_weights(version, source)

    def version(self) -> int:
        return self.engine.version

    def where(self) -> dict[str, Any]:
        from thundersync.driver.ray_pg import actor_where

        return actor_where()


class RayEngine:
    """The `rollout.engine.Engine` protocol over an engine living in a Ray actor (in rollout
    replica `replica`'s GPU bundle when the run's placement gives rollout GPUs)."""

    def __init__(self, model_dir: str, version: int = 0, *, replica: int = 0) -> None:
        import ray

        from thundersync.driver.ray_pg import actor_options
        from thundersync.driver.ray_plan import PlacementRole

        self._ray = ray
        remote: Any = ray.remote
        opts = actor_options(PlacementRole.ROLLOUT, replica, cpus=0)
        cls: Any = remote(max_concurrency=8)(_EngineActor).options(**opts)
        self.actor: Any = cls.remote(model_dir, version)
        self.where_ref: Any = self.actor.where.remote()
        self._version = version

    @property
    def version(self) -> int:
        return self._version

    def generate(
        self, prompt_ids: Any, params: Any, seed: int, *, version: int | None = None
    ) -> Any:
        return self._ray.get(self.actor.generate.remote(list(prompt_ids), params, seed, version))

    def load_weights(self, version: int, source: Any) -> Any:
        ack = self._ray.get(self.actor.load_weights.remote(version, str(source)))
        self._version = ack.version
        return ack

    def close(self) -> None:
        self._ray.kill(self.actor)


class _ScorerActor:
    def __init__(self, model_dir: str, max_open: int) -> None:
        from thundersync.driver.ray_pg import assigned_device
        from thundersync.teacher.incremental import IncrementalHFScorer
        from thundersync.teacher.scorer import HFScorer

        self.scorer: Any
        if max_open > 0:  # incremental: each open trajectory's teacher K/V lives in the actor
            self.scorer = IncrementalHFScorer.from_dir(
                model_dir, device=assigned_device(), max_open=max_open
            )
        else:
            self.scorer = HFScorer.from_dir(model_dir, device=assigned_device())

    def release(self, key: Any) -> None:
        release = getattr(self.scorer, "release", None)
        if callable(release):
            release(key)

    def stats(self) -> dict[str, Any] | None:
        from thundersync.teacher.incremental import scorer_stats

        return scorer_stats(self.scorer)

    def where(self) -> dict[str, Any]:
        from thundersync.driver.ray_pg import actor_where

        return actor_where()

    def score_batch(self, requests: Any, timeout_s: float) -> Any:
        return self.scorer.score_batch(requests, timeout_s)


class RayScorer:
    """The frozen teacher in a Ray actor (the teacher client batches and retries in front)."""

    def __init__(self, model_dir: str, *, replica: int = 0, max_open: int = 0) -> None:
        """`max_open` > 0: incremental scoring with that many kept trajectories, else full."""
        import ray

        from thundersync.driver.ray_pg import actor_options
        from thundersync.driver.ray_plan import PlacementRole

        self._ray = ray
        opts = actor_options(PlacementRole.TEACHER, replica, cpus=0)
        cls: Any = ray.remote(_ScorerActor).options(**opts)
        self.actor: Any = cls.remote(model_dir, max_open)
        self.where_ref: Any = self.actor.where.remote()

    def release(self, key: Any) -> None:
        self._ray.get(self.actor.release.remote(key))

    def stats(self) -> dict[str, Any] | None:
        return self._ray.get(self.actor.stats.remote())  # type: ignore[no-any-return]

    def score_batch(self, requests: Any, timeout_s: float = 60) -> Any:
        return self._ray.get(
            self.actor.score_batch.remote(list(requests), timeout_s), timeout=timeout_s
        )


class _SandboxWorker:
    """A sandbox worker: hosts many environments (their sessions, tool calls, verifiers)."""

    def __init__(self) -> None:
        import thundersync.sandbox.envs  # noqa: F401  (registers every ThunderSync environment)

        self.envs: dict[str, Any] = {}

    def open(self, key: str, env_id: str, extras: dict[str, Any]) -> None:
        import skyrl_gym

        self.envs[key] = skyrl_gym.make(env_id, extras=extras)

    def init(self, key: str, prompt: Any) -> Any:
        return self.envs[key].init(prompt)

    def step(self, key: str, action: str) -> Any:
        return dict(self.envs[key].step(action))

    def close(self, key: str) -> None:
        env = self.envs.pop(key, None)
        if env is not None:
            env.close()


_WORKERS: list[Any] = []
_NEXT = itertools.count()


def sandbox_workers(n: int = 2) -> list[Any]:
    """The run's sandbox-worker actors (created once, shared by every environment)."""
    import ray

    if not _WORKERS:
        remote: Any = ray.remote
        cls: Any = remote(num_cpus=0, max_concurrency=16)(_SandboxWorker)
        _WORKERS.extend(cls.remote() for _ in range(n))
    return _WORKERS


def reset_sandbox_workers() -> None:
    _WORKERS.clear()


class RayEnv:
    """An environment on a sandbox-worker actor, driven like a local `BaseTextEnv`."""

    def __init__(self, env_id: str, extras: dict[str, Any]) -> None:
        import ray

        self._ray = ray
        i = next(_NEXT)
        workers = sandbox_workers()
        self.worker: Any = workers[i % len(workers)]
        self.key = f"env-{os.getpid()}-{i}"
        ray.get(self.worker.open.remote(self.key, env_id, extras))
        self.turns = 0

    def init(self, prompt: Any = None) -> Any:
        return self._ray.get(self.worker.init.remote(self.key, prompt))

    def step(self, action: str) -> Any:
        self.turns += 1
        return self._ray.get(self.worker.step.remote(self.key, action))

    def close(self) -> None:
        self._ray.get(self.worker.close.remote(self.key))
