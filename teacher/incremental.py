"""Incremental HF teacher scoring: each open trajectory's teacher K/V is kept between its turns.

Scoring every OPD turn over the whole trajectory makes the teacher re-read the past each turn
(quadratic in turns). The teacher is frozen, so the K/V of a token prefix depends only on those
token ids: turn j needs only the tokens not yet cached (turn j-1's observation, turn j's action)
fed on top of the cache, and gets the same log-probs as one forward over the whole context (up to
fp rounding), at a cost per turn that stays flat in turns.

Never a wrong answer: a request is served from its trajectory's cache only when the cached ids
are exactly a prefix of the request's ids and the scored span starts at or after the cache's end;
otherwise the entry is dropped and the whole context is scored (and cached again). At most
`max_open` trajectories are cached (least recently used first out); an evicted trajectory is
scored in full at its next turn. `release(key)` drops a closed or aborted trajectory's cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from thundersync.teacher.scorer import ScoreRequest


@dataclass
class _Entry:
    ids: list[int]  # the tokens whose K/V `cache` holds
    cache: Any  # transformers DynamicCache over `ids`, grown in place by the next forward
    last_logits: torch.Tensor  # [V] at the last cached position: predicts the next token


@dataclass
class IncrementalStats:
    tokens: int = 0  # tokens fed through the teacher (its cost)
    hits: int = 0  # requests served on top of a cached prefix
    full: int = 0  # requests scored over their whole context
    fallbacks: int = 0  # cached entries dropped because the request did not extend them
    evictions: int = 0  # entries dropped by the `max_open` bound


class IncrementalHFScorer:
    """A Scorer on a transformers causal LM that caches teacher K/V per `ScoreRequest.key`.

    Requests without a key are scored in full and cache nothing (the HFScorer behaviour).
    """

    def __init__(self, model: Any, *, max_open: int = 64) -> None:
        if max_open < 1:
            raise ValueError(f"max_open={max_open}: keep at least one trajectory's cache")
        self.model = model
        self.device = next(model.parameters()).device
        self.max_open = max_open
        self.stats = IncrementalStats()
        self._open: OrderedDict[Hashable, _Entry] = OrderedDict()
        # TeacherClient may start a retry while a timed-out call still runs: one forward at a time
        self._lock = threading.Lock()

    @classmethod
    def from_dir(
        cls, model_dir: str | Path, *, device: Any = "cpu", dtype: Any = None, max_open: int = 64
    ) -> IncrementalHFScorer:
        from thundersync.hf_models import load_model

        model = load_model(model_dir, dtype=dtype or torch.float32).to(device)
        return cls(model, max_open=max_open)

    def score_batch(
        self, requests: Sequence[ScoreRequest], timeout_s: float = 0
    ) -> list[list[float]]:
        with self._lock, torch.no_grad():
            return [self._score(r) for r in requests]

    def release(self, key: Hashable) -> None:
        """Drop `key`'s cache (its trajectory closed or was aborted); unknown keys are ignored."""
        with self._lock:
            self._open.pop(key, None)

    def open_keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._open)

    def close(self) -> None:
        with self._lock:
            self._open.clear()

    def _score(self, r: ScoreRequest) -> list[float]:
        ids, n = r.token_ids, len(r.token_ids)
        if r.start == n:
            return []
        # popped while in use: a forward that raises leaves no half-grown cache behind
        entry = self._open.pop(r.key, None) if r.key is not None else None
        if entry is not None and not _extends(entry, r):
            self.stats.fallbacks += 1
            entry = None
        past = len(entry.ids) if entry is not None else 0
        pos = torch.arange(past, n, device=self.device)[None]
        out = self.model(
            input_ids=torch.tensor([ids[past:]], device=self.device),
            position_ids=pos,
            past_key_values=entry.cache if entry is not None else None,
            use_cache=r.key is not None,
        )
        self.stats.tokens += n - past
        logits = out.logits[0].float()
        if entry is None:
            self.stats.full += 1
            rows, base = logits, 1  # rows[j] predicts token base + j
        else:
            self.stats.hits += 1
            rows, base = torch.cat([entry.last_logits[None], logits]), past
        logp = torch.log_softmax(rows[r.start - base : n - base], dim=-1)
        tgt = torch.tensor(ids[r.start :], device=self.device)
        scores: list[float] = logp.gather(1, tgt[:, None])[:, 0].tolist()
        if r.key is not None:
            self._open[r.key] = _Entry(list(ids), out.past_key_values, logits[-1].clone())
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)
                self.stats.evictions += 1
        return scores


def _extends(entry: _Entry, r: ScoreRequest) -> bool:
    """The request continues the cached context: same leading ids, scored span after them."""
    c = len(entry.ids)
    return c <= r.start and r.token_ids[:c] == entry.ids


def scorer_stats(scorer: Any) -> dict[str, Any] | None:
    """What a scorer reports about its work (`scoring`, and the incremental counters), for the
    run log; None for a scorer that keeps none. A `RayScorer` asks its actor."""
    remote = getattr(scorer, "stats", None)
    if callable(remote):
        return remote()  # type: ignore[no-any-return]
    if isinstance(scorer, IncrementalHFScorer):
        return {"scoring": "incremental", "open": len(scorer.open_keys()), **asdict(scorer.stats)}
    return None
