"""A teacher scorer that survives its server: a dead vLLM teacher is restarted and the call retried.

TeacherClient already retries with backoff, but retrying against a dead server only delays the
failure. This wrapper checks the server after a failed call and restarts it (once per crash, under
a lock, however many rollout threads saw the failure) before the retry. The teacher is frozen, so
a restarted server scores exactly as before and the update still equals sync.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from thundersync.teacher.scorer import ScoreRequest, VLLMScorer


class SupervisedVLLMScorer:
    def __init__(self, server: Any, max_restarts: int = 3) -> None:
        self.server = server
        self.max_restarts = max_restarts
        self.restarts = 0
        self._lock = threading.Lock()
        self._scorer = VLLMScorer(server.url, server.config.served_model_name)

    def score_batch(
        self, requests: Sequence[ScoreRequest], timeout_s: float = 60
    ) -> list[list[float]]:
        try:
            return self._scorer.score_batch(requests, timeout_s)
        except Exception:
            self._ensure_up()
            return self._scorer.score_batch(requests, timeout_s)

    def _ensure_up(self) -> None:
        with self._lock:
            if self.server.is_healthy():
                return
            if self.restarts >= self.max_restarts:
                raise RuntimeError(
                    f"teacher server died {self.restarts + 1} times; see its log {self.server.log_path}"
                )
            self.restarts += 1
            self.server.restart()

    def close(self) -> None:
        self._scorer.close()
