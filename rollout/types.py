"""Typed values that cross the engine boundary (sampling parameters, generations, load acks).

They are plain dataclasses so that the HF backend, the vLLM backend and the agent loop agree on one
shape, and so that a request always says which policy version it was made for.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """Sampling for one generation request.

    `temperature == 0` means greedy. Log-probs returned by every engine are the policy's raw
    log-probs (softmax of the logits at temperature 1), which is what GRPO / OPD need, whatever
    temperature was used to sample.
    """

    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class Generation:
    """What an engine returns: the new tokens, their log-probs and the version that produced them."""

    token_ids: list[int]
    logprobs: list[float]
    version: int
    finish_reason: str  # "stop" (eos / stop token) or "length"

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError("token_ids and logprobs must have the same length")


@dataclass(frozen=True)
class LoadAck:
    """An engine's acknowledgement that it now serves `version`."""

    version: int
    method: str  # "in_place" (HF), "reload" (vLLM reload_weights), "restart" (vLLM fallback)
    seconds: float
    extra: dict[str, str] = field(default_factory=dict)
