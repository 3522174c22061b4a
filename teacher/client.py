"""TeacherClient: batching, a per-request timeout and retries with backoff around a Scorer.

Callers (the agent loop's rollout threads) call `score(token_ids, start)` concurrently; a worker
thread gathers waiting requests into batches of up to `batch_size` (waiting at most
`batch_wait_s` for company), sends each batch with a timeout, retries a failed batch with
exponential backoff and, after `retries` failed retries, fails every request in it with a
`TeacherError` that says what went wrong and how often it was tried.

`score(..., key=traj)` names the request's trajectory so an incremental scorer can keep its
teacher K/V between turns; `release(traj)` ends that (a no-op for scorers that cache nothing).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import Future

from thundersync.teacher.scorer import Scorer, ScoreRequest


class TeacherError(RuntimeError):
    """Scoring failed after every retry."""


class TeacherClient:
    def __init__(
        self,
        scorer: Scorer,
        *,
        batch_size: int = 8,
        batch_wait_s: float = 0.005,
        timeout_s: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.5,
    ) -> None:
        self.scorer = scorer
        self.batch_size = batch_size
        self.batch_wait_s = batch_wait_s
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.batches_sent = 0
        self._q: queue.Queue[tuple[ScoreRequest, Future[list[float]]] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._loop, name="teacher-client", daemon=True)
        self._worker.start()

    def score(
        self, token_ids: Sequence[int], start: int, *, key: Hashable | None = None
    ) -> list[float]:
        """Teacher log-probs of `token_ids[start:]` (blocks; safe from many threads). `key`: the
        trajectory the context belongs to (lets an incremental scorer reuse its cached prefix)."""
        fut: Future[list[float]] = Future()
        self._q.put((ScoreRequest(list(token_ids), start, key), fut))
        return fut.result()

    def release(self, key: Hashable) -> None:
        """The trajectory `key` closed or was aborted: let the scorer drop what it keeps for it.

        Called directly, not queued: its turns' scores were all awaited before it closes, and
        the scorer locks its own state. A late retry may re-cache it; the scorer's bound evicts it.
        """
        release = getattr(self.scorer, "release", None)
        if callable(release):
            release(key)

    def score_many(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        futs: list[Future[list[float]]] = []
        for r in requests:
            f: Future[list[float]] = Future()
            self._q.put((r, f))
            futs.append(f)
        return [f.result() for f in futs]

    def close(self) -> None:
        self._q.put(None)
        self._worker.join(timeout=10)

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            batch = [item]
            deadline = time.monotonic() + self.batch_wait_s
            while len(batch) < self.batch_size:
                try:
                    nxt = self._q.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if nxt is None:
                    self._q.put(None)
                    break
                batch.append(nxt)
            self._send(batch)

    def _send(self, batch: list[tuple[ScoreRequest, Future[list[float]]]]) -> None:
        reqs = [r for r, _ in batch]
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                res = self._call_with_timeout(reqs)
                self.batches_sent += 1
                for (_, f), r in zip(batch, res, strict=True):
                    f.set_result(r)
                return
            except Exception as e:  # noqa: BLE001 - retried, then reported
                last = e
        err = TeacherError(
            f"teacher scoring failed after {self.retries + 1} tries "
            f"(timeout {self.timeout_s:g} s each): {type(last).__name__}: {last}; "
            "check the teacher server (`tsrl teacher check`) or raise teacher.timeout_s / retries"
        )
        for _, f in batch:
            f.set_exception(err)

    def _call_with_timeout(self, reqs: list[ScoreRequest]) -> list[list[float]]:
        box: dict[str, object] = {}

        def run() -> None:
            try:
                box["ok"] = self.scorer.score_batch(reqs, self.timeout_s)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                box["err"] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(self.timeout_s)
        if t.is_alive():
            raise TimeoutError(f"no answer within {self.timeout_s:g} s")
        if "err" in box:
            raise box["err"]  # type: ignore[misc]
        res = box["ok"]
        assert isinstance(res, list)
        return res
