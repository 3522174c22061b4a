"""The rollout side's Ray actors: the rollout engine, the frozen teacher's scorer and the sandbox
workers that host environments, each reached through a local stand-in (`RayEngine`, `RayScorer`,
`RayEnv`). With GPUs in the config's `placement:` section the engine and teacher actors run in
their bundles of the run's placement group (cluster/ray_pg.py); the learner ranks' actors are in
cluster/ray_learners.py.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thundersync.cluster.ray_pg import actor_options, actor_where, assigned_device
from thundersync.cluster.ray_plan import PlacementRole
from thundersync.rollout.types import Generation, LoadAck, SamplingParams

if TYPE_CHECKING:
    import torch

    from thundersync.teacher.incremental import IncrementalHFScorer
    from thundersync.teacher.scorer import HFScorer, ScoreRequest


# ---- rollout engine, teacher and sandbox environments as Ray actors ---------------------------
class _EngineActor:
    def __init__(self, model_dir: str, version: int) -> None:
        import torch

        from thundersync.rollout.hf_engine import HFEngine

        torch.set_num_threads(1)
        self.engine = HFEngine(model_dir, version=version, device=assigned_device())

    def generate(
        self, prompt_ids: list[int], params: SamplingParams, seed: int, version: int | None
    ) -> Generation:
        return self.engine.generate(prompt_ids, params, seed, version=version)

    def load_weights(self, version: int, source: str) -> LoadAck:
        return self.engine.load_weights(version, source)

    def version(self) -> int:
        return self.engine.version

    def where(self) -> dict[str, Any]:
        return actor_where()


class RayEngine:
    """The `rollout.inference_engine.InferenceEngine` protocol over an engine living in a Ray actor (in rollout
    replica `replica`'s GPU bundle when the run's placement gives rollout GPUs)."""

    def __init__(self, model_dir: str, version: int = 0, *, replica: int = 0) -> None:
        import ray

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
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        seed: int,
        *,
        version: int | None = None,
    ) -> Generation:
        ref = self.actor.generate.remote(list(prompt_ids), params, seed, version)
        gen: Generation = self._ray.get(ref)
        return gen

    def load_weights(
        self, version: int, source: str | Path | Mapping[str, torch.Tensor]
    ) -> LoadAck:
        ack: LoadAck = self._ray.get(self.actor.load_weights.remote(version, str(source)))
        self._version = ack.version
        return ack

    def close(self) -> None:
        self._ray.kill(self.actor)


class _ScorerActor:
    def __init__(self, model_dir: str, max_open: int) -> None:
        from thundersync.teacher.incremental import IncrementalHFScorer
        from thundersync.teacher.scorer import HFScorer

        self.scorer: IncrementalHFScorer | HFScorer
        if max_open > 0:  # incremental: each open trajectory's teacher K/V lives in the actor
            self.scorer = IncrementalHFScorer.from_dir(
                model_dir, device=assigned_device(), max_open=max_open
            )
        else:
            self.scorer = HFScorer.from_dir(model_dir, device=assigned_device())

    def release(self, key: Hashable) -> None:
        release = getattr(self.scorer, "release", None)
        if callable(release):
            release(key)

    def stats(self) -> dict[str, Any] | None:
        from thundersync.teacher.incremental import scorer_stats

        return scorer_stats(self.scorer)

    def where(self) -> dict[str, Any]:
        return actor_where()

    def score_batch(self, requests: Sequence[ScoreRequest], timeout_s: float) -> list[list[float]]:
        return self.scorer.score_batch(requests, timeout_s)


class RayScorer:
    """The frozen teacher in a Ray actor (the teacher client batches and retries in front)."""

    def __init__(self, model_dir: str, *, replica: int = 0, max_open: int = 0) -> None:
        """`max_open` > 0: incremental scoring with that many kept trajectories, else full."""
        import ray

        self._ray = ray
        opts = actor_options(PlacementRole.TEACHER, replica, cpus=0)
        cls: Any = ray.remote(_ScorerActor).options(**opts)
        self.actor: Any = cls.remote(model_dir, max_open)
        self.where_ref: Any = self.actor.where.remote()

    def release(self, key: Hashable) -> None:
        self._ray.get(self.actor.release.remote(key))

    def stats(self) -> dict[str, Any] | None:
        return self._ray.get(self.actor.stats.remote())  # type: ignore[no-any-return]

    def score_batch(
        self, requests: Sequence[ScoreRequest], timeout_s: float = 60
    ) -> list[list[float]]:
        ref = self.actor.score_batch.remote(list(requests), timeout_s)
        scores: list[list[float]] = self._ray.get(ref, timeout=timeout_s)
        return scores


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
