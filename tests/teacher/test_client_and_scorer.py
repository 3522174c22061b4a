"""TeacherClient batching / timeout / retries and the HF scorer's agreement with the policy engine."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from thundersync.rollout.hf_engine import HFEngine
from thundersync.rollout.types import SamplingParams
from thundersync.teacher.client import TeacherClient, TeacherError
from thundersync.teacher.scorer import HFScorer, ScoreRequest


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> HFScorer:
    return HFScorer.from_dir(tiny_model_dir)


class Flaky:
    """Fails the first `fails` batches, then delegates to a real scorer."""

    def __init__(self, inner: HFScorer, fails: int) -> None:
        self.inner, self.fails, self.calls = inner, fails, 0

    def score_batch(self, requests: Sequence[ScoreRequest], timeout_s: float) -> list[list[float]]:
        self.calls += 1
        if self.calls <= self.fails:
            raise ConnectionError("teacher replica restarting")
        return self.inner.score_batch(requests, timeout_s)


def test_hf_scorer_reproduces_the_policy_engines_logprobs(
    tiny_model_dir: Path, hf: HFScorer
) -> None:
    eng = HFEngine(tiny_model_dir)
    prompt = [1, 20, 21, 22]
    g = eng.generate(prompt, SamplingParams(max_new_tokens=8), seed=5)
    (scores,) = hf.score_batch([ScoreRequest(prompt + g.token_ids, len(prompt))], 0)
    assert max(abs(a - b) for a, b in zip(scores, g.logprobs, strict=True)) < 1e-4


def test_concurrent_requests_are_batched(hf: HFScorer) -> None:
    client = TeacherClient(hf, batch_size=8, batch_wait_s=0.5)
    reqs = [ScoreRequest([1, 5 + i, 6, 7, 8], 2) for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda r: client.score(r.token_ids, r.start), reqs))
    client.close()
    assert got == hf.score_batch(reqs, 0)
    assert client.batches_sent < len(reqs)


def test_transient_failures_are_retried(hf: HFScorer) -> None:
    flaky = Flaky(hf, fails=2)
    client = TeacherClient(flaky, retries=3, backoff_s=0.01)
    assert len(client.score([1, 5, 6, 7], 1)) == 3
    client.close()
    assert flaky.calls == 3


def test_gives_up_with_a_clear_error_after_n_tries(hf: HFScorer) -> None:
    flaky = Flaky(hf, fails=100)
    client = TeacherClient(flaky, retries=2, backoff_s=0.01)
    with pytest.raises(TeacherError, match=r"after 3 tries.*ConnectionError.*teacher replica"):
        client.score([1, 5, 6, 7], 1)
    client.close()
    assert flaky.calls == 3


def test_a_hung_backend_times_out(hf: HFScorer) -> None:
    release = threading.Event()

    class Hung:
        def score_batch(
            self, requests: Sequence[ScoreRequest], timeout_s: float
        ) -> list[list[float]]:
            release.wait(60)
            return [[0.0]]

    client = TeacherClient(Hung(), timeout_s=0.2, retries=1, backoff_s=0.01)
    try:
        with pytest.raises(TeacherError, match="TimeoutError"):
            client.score([1, 5], 1)
    finally:
        release.set()
        client.close()


def test_request_without_context_is_refused() -> None:
    with pytest.raises(ValueError, match="no context"):
        ScoreRequest([1, 2, 3], 0)
