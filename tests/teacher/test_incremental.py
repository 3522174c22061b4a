"""Incremental teacher scoring equals full-context scoring: per turn, after a mismatched prefix,
after eviction, after release; and the teacher's tokens per turn stay flat in turns."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from thundersync.hf_models import load_model, load_tokenizer
from thundersync.rollout.agent_loop import AgentLoop, AgentLoopConfig, RolloutTask
from thundersync.rollout.chat import TokenizerChatFormat
from thundersync.rollout.hf_engine import HFEngine
from thundersync.rollout.trajectory import TrajectoryRef
from thundersync.rollout.types import SamplingParams
from thundersync.sandbox.envs.calc_env import ToyCalcEnv
from thundersync.teacher.client import TeacherClient
from thundersync.teacher.incremental import IncrementalHFScorer
from thundersync.teacher.scorer import ScoreRequest

TOL = 1e-5
OBS, ACT = 7, 9  # tokens per observation / action


@pytest.fixture(scope="module")
def model(tiny_teacher_dir: Path) -> Any:
    return load_model(tiny_teacher_dir, dtype=torch.float32)


def _reference(model: Any, ids: list[int], start: int) -> list[float]:
    """An independent full forward of the whole sequence (not the code under test)."""
    with torch.no_grad():
        logp = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    return [float(logp[t - 1, ids[t]]) for t in range(start, len(ids))]


def _turns(model: Any, n_turns: int, seed: int = 0) -> list[ScoreRequest]:
    """The agent loop's requests for one trajectory: growing context, the action scored."""
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    ctx = [rng.randrange(vocab) for _ in range(12)]
    reqs = []
    for j in range(n_turns):
        if j:
            ctx += [rng.randrange(vocab) for _ in range(OBS)]
        start = len(ctx)
        ctx += [rng.randrange(vocab) for _ in range(ACT)]
        reqs.append(ScoreRequest(list(ctx), start))
    return reqs


def _keyed(r: ScoreRequest, key: Any) -> ScoreRequest:
    return ScoreRequest(r.token_ids, r.start, key)


def _diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_every_turn_equals_a_full_forward(model: Any) -> None:
    sc = IncrementalHFScorer(model)
    key = TrajectoryRef("task", 0)
    for r in _turns(model, 8):
        (got,) = sc.score_batch([_keyed(r, key)])
        assert _diff(got, _reference(model, r.token_ids, r.start)) <= TOL
    assert (sc.stats.full, sc.stats.hits, sc.stats.fallbacks) == (1, 7, 0)
    assert sc.open_keys() == [key]


def test_a_request_that_does_not_extend_the_cache_falls_back_exactly(model: Any) -> None:
    sc = IncrementalHFScorer(model)
    key = TrajectoryRef("task", 1)
    reqs = _turns(model, 4, seed=1)
    for r in reqs[:3]:
        sc.score_batch([_keyed(r, key)])
    edited = list(reqs[3].token_ids)
    edited[3] = (edited[3] + 1) % model.config.vocab_size  # an early token differs
    inside = ScoreRequest(reqs[3].token_ids, reqs[1].start, key)  # span inside the cached part
    for r in (ScoreRequest(edited, reqs[3].start, key), inside):
        (got,) = sc.score_batch([r])
        assert _diff(got, _reference(model, r.token_ids, r.start)) <= TOL
    assert sc.stats.fallbacks == 2 and sc.stats.full == 3


def test_eviction_falls_back_to_an_exact_full_score(model: Any) -> None:
    sc = IncrementalHFScorer(model, max_open=2)
    keys = [TrajectoryRef("t", i) for i in range(3)]
    trajs = {k: _turns(model, 3, seed=10 + k.repetition) for k in keys}
    for j in range(3):  # round robin over 3 trajectories with room for 2: every turn evicts
        for k in keys:
            r = trajs[k][j]
            (got,) = sc.score_batch([_keyed(r, k)])
            assert _diff(got, _reference(model, r.token_ids, r.start)) <= TOL
    assert sc.stats.evictions == 7 and sc.stats.hits == 0 and len(sc.open_keys()) == 2


def test_release_frees_the_cache_and_keyless_requests_cache_nothing(model: Any) -> None:
    sc = IncrementalHFScorer(model)
    key = TrajectoryRef("task", 2)
    reqs = _turns(model, 3, seed=2)
    client = TeacherClient(sc)
    try:
        client.score(reqs[0].token_ids, reqs[0].start, key=key)
        assert sc.open_keys() == [key]
        client.release(key)
        assert sc.open_keys() == []
        got = client.score(reqs[1].token_ids, reqs[1].start, key=key)  # full again, still exact
        assert _diff(got, _reference(model, reqs[1].token_ids, reqs[1].start)) <= TOL
        assert sc.stats.full == 2
        client.release(TrajectoryRef("never", 0))  # unknown keys are ignored
        sc.close()
        client.score(reqs[2].token_ids, reqs[2].start)  # no key: scored in full, not kept
        assert sc.open_keys() == []
    finally:
        client.close()


def test_teacher_tokens_per_turn_stay_flat_in_turns(model: Any) -> None:
    per_turn: dict[int, list[int]] = {}
    for n_turns in (2, 32):
        sc = IncrementalHFScorer(model)
        counts = []
        for r in _turns(model, n_turns, seed=3):
            before = sc.stats.tokens
            sc.score_batch([_keyed(r, TrajectoryRef("flat", n_turns))])
            counts.append(sc.stats.tokens - before)
        per_turn[n_turns] = counts
    # after the first turn every turn feeds exactly its observation + action, at 2 or 32 turns
    assert set(per_turn[2][1:]) == set(per_turn[32][1:]) == {OBS + ACT}
    assert per_turn[32][0] == per_turn[2][0] == 12 + ACT


def test_the_agent_loop_keys_and_releases_its_trajectories(
    tiny_model_dir: Path, tiny_teacher_dir: Path, model: Any
) -> None:
    sc = IncrementalHFScorer(model)
    client = TeacherClient(sc)
    chat = TokenizerChatFormat(load_tokenizer(tiny_model_dir), max_obs_tokens=16)
    cfg = AgentLoopConfig(max_turns=3, sampling=SamplingParams(5), concurrency=2)
    mk = lambda: ToyCalcEnv(extras={"answer": "5", "max_turns": 3})  # noqa: E731
    tasks = [RolloutTask(f"t{i}", mk, [{"role": "user", "content": "2+3?"}], i) for i in range(2)]
    try:
        trajs = AgentLoop(HFEngine(tiny_model_dir), chat, cfg, teacher=client).run(tasks)
    finally:
        client.close()
    assert sc.open_keys() == []  # every trajectory released its cache when it ended
    assert sc.stats.hits == sum(len(t.turns) - 1 for t in trajs) > 0
    for tr in trajs:
        ids = tr.prompt_ids + tr.response_ids
        for t in tr.turns:
            end = t.context_len + len(t.action_ids)
            assert t.teacher_logprobs is not None
            assert _diff(t.teacher_logprobs, _reference(model, ids[:end], t.context_len)) <= TOL
