"""Weight publishing: the learner's `publish(version, state_dict)` hook.

After each optimizer step the learner calls `publish(k+1, state_dict)`. The publisher writes the
weights once as an HF checkpoint directory (safetensors + config, tokenizer), makes every engine
load it and returns only when all of them acknowledged version k+1 — so the driver can start the
rollouts of update k+1 right after `publish` returns, and the engines' version gates refuse
anything else. A failed acknowledgement raises: training must not continue on mixed versions.

`ShmPublisher` is the shared-memory transport's writer (the learner's, worker/policy_writer.py):
full versions in `slots` reused in turn, or a delta against the version every replica acked
(rollout/weight_delta.py). `ShmWeightPublisher` is the same as an in-process hook over engines.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from thundersync.rollout.checkpoint import save_checkpoint, version_dir
from thundersync.rollout.inference_engine import InferenceEngine
from thundersync.rollout.replicas import load_everywhere
from thundersync.rollout.types import LoadAck
from thundersync.rollout.weight_delta import Delta, DeltaTracker
from thundersync.rollout.weight_wire import (
    ShmWeights,
    delta_path,
    segment_path,
    write_delta_shm,
    write_shm,
)


class PublishHook(Protocol):
    """The learner's hook (learner.barrier.Publisher): returns the version every engine acked."""

    def __call__(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> int: ...


class PublishError(RuntimeError):
    """At least one engine did not acknowledge the published version."""


class WeightPublisher:
    """Save -> load on every engine (in parallel) -> wait for every ack. Callable as the hook."""

    def __init__(
        self,
        engines: Sequence[InferenceEngine],
        checkpoint_root: str | Path,
        base_model_dir: str | Path,
        *,
        keep_last: int = 2,
    ) -> None:
        self.engines = list(engines)
        self.root = Path(checkpoint_root)
        self.base_model_dir = Path(base_model_dir)
        self.keep_last = max(1, keep_last)
        self.acks: dict[int, list[LoadAck]] = {}

    def __call__(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> int:
        acks = self.publish(version, state_dict)
        return min(a.version for a in acks) if acks else version

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> list[LoadAck]:
        path = save_checkpoint(version_dir(self.root, version), state_dict, self.base_model_dir)
        ids = [f"engine {i}" for i in range(len(self.engines))]
        acks, errors = load_everywhere(self.engines, ids, version, path)
        if errors:
            raise PublishError(f"publish of version {version} failed: " + "; ".join(errors))
        self.acks[version] = acks
        self._prune(version)
        return acks

    def _prune(self, latest: int) -> None:
        old = sorted(p for p in self.root.glob("v*") if p.is_dir() and p.name[1:].isdigit())
        for p in old[: -self.keep_last]:
            if int(p.name[1:]) < latest:
                shutil.rmtree(p, ignore_errors=True)


class ShmPublisher:
    """Writes each version into shared memory for the replicas: a delta when every replica that
    will read it holds the acked base and the delta is smaller, else the full version (a full
    slot, reused in turn: rewritten only after every replica acked a later version). When some
    replicas hold the base and others do not, both are written and the delta's index names the
    full segment, so each replica takes what fits it."""

    def __init__(
        self,
        run_tag: str,
        *,
        slots: int = 2,
        owners: tuple[int, ...] = (),
        delta: bool = True,
        from_host: bool = True,
        host_base: bool = False,
    ) -> None:
        """`from_host` False (`publish.delta: auto`): deltas only of weights on an accelerator,
        where the diff runs at device bandwidth and the device-to-host copy is the cost (H200:
        4.3x faster at lr 1e-6); a host diff reads twice the bytes a full write copies (0.34x
        here). docs/RESULTS.md, "Delta publish". `host_base` (`publish.delta_base: host`): the
        delta's base in host memory, not beside the weights (rollout/weight_delta.py)."""
        self.run_tag, self.slots, self.owners = run_tag, max(1, slots), owners
        self.from_host = from_host
        self.tracker = DeltaTracker(host=host_base) if delta else None
        self._pending: tuple[int, Mapping[str, torch.Tensor], Delta | None] | None = None
        self._used: set[Path] = set()
        self.last: dict[str, Any] = {}  # the last write: kind, bytes, changed_fraction, seconds
        self.last_segment: ShmWeights | None = None

    def write(
        self,
        version: int,
        state: Mapping[str, torch.Tensor],
        replica_versions: Sequence[int] | None = None,
    ) -> str:
        """The uri to publish. `replica_versions`: what each replica holds now (None: every
        replica acked the last version this publisher wrote, as the learner knows from acks)."""
        t0 = time.perf_counter()
        tr, delta = self.tracker, None
        if tr is not None and not self.from_host:
            tr = tr if any(t.device.type != "cpu" for t in state.values()) else None
        base = tr.base_version if tr is not None else None
        held = list(replica_versions) if replica_versions is not None else [base]
        if tr is not None and base is not None and base in held:
            delta = tr.diff(version, state)
        full_uri = None
        if delta is None or any(v != base for v in held):
            seg = write_shm(
                segment_path(self.run_tag, version % self.slots),
                state,
                version=version,
                owners=self.owners,
            )
            self._used.add(seg.path)
            full_uri = seg.uri
        uri = full_uri
        if delta is not None:
            shapes = {k: (list(v.shape), v.dtype) for k, v in state.items()}
            dseg = write_delta_shm(
                delta_path(self.run_tag),
                delta.changes,
                shapes,
                version=version,
                base=delta.base,
                full=full_uri,
                owners=self.owners,
            )
            self._used.add(dseg.path)
            uri = dseg.uri
        self.last_segment = ShmWeights.parse(str(uri))
        self._pending = (version, state, delta) if tr is not None else None
        last = tr.last if tr is not None and tr.last is not None else None
        full_bytes = sum(v.numel() * v.element_size() for v in state.values())
        self.last = {
            "kind": "delta" if delta is not None else "full",
            "full_bytes": full_bytes,
            "bytes": delta.nbytes if delta is not None else full_bytes,
            "changed_fraction": last.changed_fraction if last and last.version == version else None,
            "write_s": time.perf_counter() - t0,
        }
        return str(uri)

    def acked(self, version: int) -> None:
        """Every replica acked `version`: it becomes the base of the next delta."""
        if self._pending is None or self._pending[0] != version:
            return
        _, state, delta = self._pending
        self._pending = None
        if self.tracker is not None:
            self.tracker.acked(version, state, delta)

    def failed(self) -> None:
        """A publish was not acked by every replica: their versions are unknown, so the next
        version goes out in full."""
        self._pending = None
        if self.tracker is not None:
            self.tracker.forget()

    def close(self) -> None:
        for p in self._used:
            ShmWeights(p).remove()
        self._used = set()


class ShmWeightPublisher:
    """The publish hook over in-process engines through shared memory (`ShmPublisher`): each
    engine's own version decides whether it may take the delta."""

    def __init__(
        self,
        engines: Sequence[InferenceEngine],
        run_tag: str,
        *,
        delta: bool = True,
        host_base: bool = False,
    ) -> None:
        self.engines = list(engines)
        self.shm = ShmPublisher(run_tag, delta=delta, host_base=host_base)
        self.acks: dict[int, list[LoadAck]] = {}

    def __call__(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> int:
        uri = self.shm.write(version, state_dict, [e.version for e in self.engines])
        ids = [f"engine {i}" for i in range(len(self.engines))]
        acks, errors = load_everywhere(self.engines, ids, version, uri)
        if errors:
            self.shm.failed()
            raise PublishError(f"publish of version {version} failed: " + "; ".join(errors))
        self.shm.acked(version)
        self.acks[version] = acks
        return version

    def close(self) -> None:
        self.shm.close()
