"""Inference engine replicas behind the `InferenceEngine` protocol: sticky routing, all-or-nothing
loads.

A trajectory is routed to one replica for its whole life (`route(key)` at its start, `release`
at its end), so every turn hits the replica whose prefix cache holds its context; a new
trajectory goes to the replica with the fewest open ones, so each serves many at once (vLLM
batches them continuously). A weight load goes to every replica in parallel and returns only when
all of them acknowledged the version: the driver starts update k+1's rollouts after that, and each
replica's own version gate refuses a request for k+1 before it loaded k+1, so no request of k+1
reaches any replica early.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from thundersync.rollout.inference_engine import InferenceEngine
from thundersync.rollout.types import Generation, LoadAck, SamplingParams

if TYPE_CHECKING:
    import torch


class ReplicaLoadError(RuntimeError):
    """At least one replica did not acknowledge a version (training must not go on mixed)."""


@runtime_checkable
class Router(Protocol):
    """An engine that pins a trajectory (by its id) to one of several replicas."""

    def route(self, key: str) -> InferenceEngine: ...

    def release(self, key: str) -> None: ...


class ReplicaSet:
    def __init__(
        self, engines: Sequence[InferenceEngine], ids: Sequence[str] | None = None
    ) -> None:
        if not engines:
            raise ValueError("a replica set needs at least one engine")
        self.engines = list(engines)
        self.ids = list(ids) if ids is not None else [f"engine-{i}" for i in range(len(engines))]
        self._pins: dict[str, int] = {}
        self._open = [0] * len(self.engines)
        self._next = 0
        self._lock = threading.Lock()
        self.last_acks: list[LoadAck] = []
        self.routed: list[int] = [0] * len(self.engines)  # trajectories each replica has served

    @property
    def version(self) -> int:
        return min(e.version for e in self.engines)

    def route(self, key: str) -> InferenceEngine:
        with self._lock:
            i = self._pins.get(key)
            if i is None:
                i = min(range(len(self.engines)), key=lambda j: (self._open[j], j))
                self._pins[key] = i
                self._open[i] += 1
                self.routed[i] += 1
            return self.engines[i]

    def release(self, key: str) -> None:
        with self._lock:
            i = self._pins.pop(key, None)
            if i is not None:
                self._open[i] -= 1

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        seed: int,
        *,
        version: int | None = None,
    ) -> Generation:
        """Unrouted calls (evaluation, checks) take the replicas in turn."""
        with self._lock:
            i, self._next = self._next, (self._next + 1) % len(self.engines)
        return self.engines[i].generate(prompt_ids, params, seed, version=version)

    def load_weights(
        self, version: int, source: str | Path | Mapping[str, torch.Tensor]
    ) -> LoadAck:
        acks, errors = load_everywhere(self.engines, self.ids, version, source)
        if errors:
            raise ReplicaLoadError(f"loading v{version} failed on " + "; ".join(errors))
        self.last_acks = acks
        methods = sorted({a.method for a in acks})
        return LoadAck(
            version,
            "+".join(methods),
            max(a.seconds for a in acks),
            {"replicas": str(len(acks))},
        )

    def close(self) -> None:
        for e in self.engines:
            e.close()


def load_everywhere(
    engines: Sequence[InferenceEngine],
    ids: Sequence[str],
    version: int,
    source: str | Path | Mapping[str, torch.Tensor],
) -> tuple[list[LoadAck], list[str]]:
    """Every engine loads `version` at once (a broadcast needs all of them joined); their acks,
    and one error line per engine that failed or acked another version."""
    errors: list[str] = []
    acks: list[LoadAck] = []
    with ThreadPoolExecutor(max_workers=max(1, len(engines))) as pool:
        futs = [pool.submit(e.load_weights, version, source) for e in engines]
        for rid, f in zip(ids, futs, strict=True):
            try:
                ack = f.result()
            except Exception as e:  # noqa: BLE001 - reported together by the caller
                errors.append(f"{rid}: {type(e).__name__}: {e}")
                continue
            if ack.version != version:
                errors.append(f"{rid} acknowledged v{ack.version}, not v{version}")
            acks.append(ack)
    return acks, errors
