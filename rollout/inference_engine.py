"""The inference engine Protocol shared by every generation backend (HF in-process, vLLM server).

Named apart from the learner's `GradientEngine`: an inference engine generates from prompt token
ids (token in, token out: no re-tokenisation drift between what was sampled and what the learner
scores), reports the policy version it serves, and loads new weights for a version, returning an
acknowledgement. `WeightSource` is either a checkpoint
directory (HF layout: config.json + safetensors) or an in-memory state dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from thundersync.rollout.types import Generation, LoadAck, SamplingParams

if TYPE_CHECKING:
    import torch


@runtime_checkable
class InferenceEngine(Protocol):
    @property
    def version(self) -> int:
        """The policy version this engine has acknowledged and serves."""
        ...

    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        seed: int,
        *,
        version: int | None = None,
    ) -> Generation:
        """Sample a continuation of `prompt_ids`; blocks until `version` is served (None: current)."""
        ...

    def load_weights(
        self, version: int, source: str | Path | Mapping[str, torch.Tensor]
    ) -> LoadAck:
        """Serve `source` as policy `version`; returns once the engine acknowledges it."""
        ...

    def close(self) -> None: ...
