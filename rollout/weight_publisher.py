"""Weight publishing: the learner's `publish(version, state_dict)` hook.

After each optimizer step the learner calls `publish(k+1, state_dict)`. The publisher writes the
weights once as an HF checkpoint directory (safetensors + config, tokenizer), makes every engine
load it and returns only when all of them acknowledged version k+1 — so the driver can start the
rollouts of update k+1 right after `publish` returns, and the engines' version gates refuse
anything else. A failed acknowledgement raises: training must not continue on mixed versions.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from thundersync.rollout.checkpoint import save_checkpoint, version_dir
from thundersync.rollout.inference_engine import InferenceEngine
from thundersync.rollout.replicas import load_everywhere
from thundersync.rollout.types import LoadAck

if TYPE_CHECKING:
    import torch


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
