"""Several frozen vLLM teacher replicas behind one scorer (OPD on a GPU node: e.g. 2 teacher GPUs).

Each call goes whole to one replica, in turn. The teacher is frozen and vLLM scores the full
context of every request (its prefix cache is skipped for prompt_logprobs requests), so which
replica scores a turn changes nothing in the scores: routing is for load only, and a replica's
own restart-on-death (`SupervisedVLLMScorer`) still applies.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from typing import Any

from thundersync.teacher.scorer import ScoreRequest
from thundersync.teacher.supervised import SupervisedVLLMScorer


class TeacherReplicas:
    def __init__(self, scorers: Sequence[SupervisedVLLMScorer]) -> None:
        if not scorers:
            raise ValueError("TeacherReplicas needs at least one replica")
        self.scorers = list(scorers)
        self.calls = [0] * len(self.scorers)
        self._turn = itertools.cycle(range(len(self.scorers)))
        self._lock = threading.Lock()

    def score_batch(
        self, requests: Sequence[ScoreRequest], timeout_s: float = 60
    ) -> list[list[float]]:
        with self._lock:
            i = next(self._turn)
            self.calls[i] += 1
        return self.scorers[i].score_batch(requests, timeout_s)

    def stats(self) -> dict[str, Any]:
        """For the run log: how many calls each replica served, and its restarts."""
        return {
            "scoring": "full",
            "replicas": len(self.scorers),
            "calls": list(self.calls),
            "restarts": [s.restarts for s in self.scorers],
        }

    def close(self) -> None:
        for s in self.scorers:
            s.close()
