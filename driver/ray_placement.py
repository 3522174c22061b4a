"""Ray placement: the learner as a Ray actor, reached over the Redis Streams bus.

`tsrl train --ray ADDRESS` places the learner (which owns the model, optimizer and checkpoints)
on a Ray worker with `learner_cpus` CPUs; the driver process keeps the rollout engines, the agent
loop and the sandboxes. A process on another node cannot share the embedded process bus, so Ray
placement always uses Redis Streams (`--redis-url`, reachable from every node). The handle below
gives the driver the same supervision calls it uses for a local learner process.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from bus.factory import BusRef
from driver.learner_proc import LearnerSpec, learner_main


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


# ---- rollout engine, teacher and sandbox environments as Ray actors ---------------------------
class _EngineActor:
    def __init__(self, model_dir: str, version: int) -> None:
        import torch

        from rollout.hf_engine import HFEngine

        torch.set_num_threads(1)
        self.engine = HFEngine(model_dir, version=version)

    def generate(self, prompt_ids: list[int], params: Any, seed: int, version: int | None) -> Any:
        return self.engine.generate(prompt_ids, params, seed, version=version)

    def load_weights(self, version: int, source: str) -> Any:
        return self.engine.load_weights(version, source)

    def version(self) -> int:
        return self.engine.version


class RayEngine:
    """The `rollout.engine.Engine` protocol over an engine living in a Ray actor."""

    def __init__(self, model_dir: str, version: int = 0) -> None:
        import ray

        self._ray = ray
        remote: Any = ray.remote
        cls: Any = remote(num_cpus=0, max_concurrency=8)(_EngineActor)
        self.actor: Any = cls.remote(model_dir, version)
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
    def __init__(self, model_dir: str) -> None:
        from teacher.scorer import HFScorer

        self.scorer = HFScorer.from_dir(model_dir)

    def score_batch(self, requests: Any, timeout_s: float) -> Any:
        return self.scorer.score_batch(requests, timeout_s)


class RayScorer:
    """The frozen teacher in a Ray actor (the teacher client batches and retries in front)."""

    def __init__(self, model_dir: str) -> None:
        import ray

        self._ray = ray
        cls: Any = ray.remote(num_cpus=0)(_ScorerActor)
        self.actor: Any = cls.remote(model_dir)

    def score_batch(self, requests: Any, timeout_s: float = 60) -> Any:
        return self._ray.get(
            self.actor.score_batch.remote(list(requests), timeout_s), timeout=timeout_s
        )


class _SandboxWorker:
    """A sandbox worker: hosts many environments (their sessions, tool calls, verifiers)."""

    def __init__(self) -> None:
        import sandbox.envs  # noqa: F401  (registers every ThunderSync environment)

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
