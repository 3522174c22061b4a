"""Teacher scorers: the log-prob of each action token of a turn under its realised causal context.

A request is `(token_ids, start)`: score `token_ids[start:]`, each token given everything before it.
The vLLM scorer asks an OpenAI-compatible server for `prompt_logprobs` on a token-id prompt
(`max_tokens=1`, `prompt_logprobs=0`: vLLM always includes the actual prompt token's log-prob) and
batches many prompts into one request. The HF scorer runs one forward per request in-process.
A request may carry its trajectory's `key`: full-context scorers ignore it, the incremental one
(teacher/incremental.py) keeps that trajectory's teacher K/V under it between turns.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx


@dataclass(frozen=True)
class ScoreRequest:
    token_ids: list[int]
    start: int
    key: Hashable | None = None  # the trajectory (e.g. its TrajectoryRef); None: no cache

    def __post_init__(self) -> None:
        if not 1 <= self.start <= len(self.token_ids):
            raise ValueError(
                f"start={self.start} must be in [1, {len(self.token_ids)}]: the first token has "
                "no context to be scored under"
            )


class Scorer(Protocol):
    def score_batch(
        self, requests: Sequence[ScoreRequest], timeout_s: float
    ) -> list[list[float]]: ...


class ScoringError(RuntimeError):
    """The scoring backend answered with an error or an unexpected payload."""


class HFScorer:
    """In-process scorer on a transformers causal LM (shares the model object it is given)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.device = next(model.parameters()).device

    @classmethod
    def from_dir(cls, model_dir: str | Path, *, device: Any = "cpu", dtype: Any = None) -> HFScorer:
        import torch

        from thundersync.hf_models import load_model

        return cls(load_model(model_dir, dtype=dtype or torch.float32).to(device))

    def score_batch(
        self, requests: Sequence[ScoreRequest], timeout_s: float = 0
    ) -> list[list[float]]:
        import torch

        out = []
        with torch.no_grad():
            for r in requests:
                ids = torch.tensor([r.token_ids], device=self.device)
                logp = torch.log_softmax(self.model(input_ids=ids).logits[0].float(), dim=-1)
                pos = torch.arange(r.start, len(r.token_ids), device=self.device)
                out.append(logp[pos - 1, ids[0, pos]].tolist())
        return out


class VLLMScorer:
    """Scorer over a vLLM server's /v1/completions with `prompt_logprobs`."""

    def __init__(self, base_url: str, model_name: str = "policy") -> None:
        self.base_url = base_url.rstrip("/")
        self.model_name = model_name
        self._client = httpx.Client()

    def score_batch(
        self, requests: Sequence[ScoreRequest], timeout_s: float = 60
    ) -> list[list[float]]:
        body = {
            "model": self.model_name,
            "prompt": [r.token_ids for r in requests],
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": 0,
        }
        resp = self._client.post(f"{self.base_url}/v1/completions", json=body, timeout=timeout_s)
        if resp.status_code != 200:
            raise ScoringError(f"vLLM scoring -> HTTP {resp.status_code}: {resp.text[:300]}")
        choices = sorted(resp.json()["choices"], key=lambda c: c["index"])
        if len(choices) != len(requests):
            raise ScoringError(f"asked for {len(requests)} prompts, got {len(choices)} choices")
        out = []
        for r, c in zip(requests, choices, strict=True):
            plp = c.get("prompt_logprobs")
            if plp is None:
                raise ScoringError("server returned no prompt_logprobs: is it vLLM >= 0.6?")
            out.append(
                [
                    float(plp[i][str(r.token_ids[i])]["logprob"])
                    for i in range(r.start, len(r.token_ids))
                ]
            )
        return out

    def close(self) -> None:
        self._client.close()
