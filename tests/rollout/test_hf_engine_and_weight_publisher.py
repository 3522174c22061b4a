"""HF engine: seeded determinism, exact log-probs, version gate, publishing with acks."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from thundersync.rollout.gate import StaleRequestError, VersionGate, VersionTimeoutError
from thundersync.rollout.hf_engine import HFEngine
from thundersync.rollout.types import SamplingParams
from thundersync.rollout.weight_publisher import WeightPublisher

PROMPT = [1, 10, 11, 12, 13]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> HFEngine:
    return HFEngine(tiny_model_dir)


def test_same_seed_gives_same_tokens_and_other_seed_differs(engine: HFEngine) -> None:
    p = SamplingParams(max_new_tokens=12, temperature=1.0)
    a = engine.generate(PROMPT, p, seed=7)
    b = engine.generate(PROMPT, p, seed=7)
    c = engine.generate(PROMPT, p, seed=8)
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs
    assert a.token_ids != c.token_ids


def test_logprobs_match_a_full_forward_of_the_sequence(engine: HFEngine) -> None:
    g = engine.generate(PROMPT, SamplingParams(max_new_tokens=10, temperature=0.7), seed=3)
    ids = torch.tensor([PROMPT + g.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(engine.model(input_ids=ids).logits[0].float(), -1)
    ref = [float(logp[len(PROMPT) - 1 + i, t]) for i, t in enumerate(g.token_ids)]
    assert max(abs(x - y) for x, y in zip(ref, g.logprobs, strict=True)) < 1e-4


def test_gate_blocks_future_versions_and_refuses_stale_ones() -> None:
    gate = VersionGate(0)
    with pytest.raises(VersionTimeoutError, match="publish"), gate.request(1, timeout_s=0.05):
        pass
    with gate.loading(1):
        pass
    with pytest.raises(StaleRequestError, match="version 0"), gate.request(0):
        pass
    with gate.request(1) as v:
        assert v == 1


def test_request_waiting_for_next_version_proceeds_once_it_is_acked() -> None:
    gate = VersionGate(0)
    got: list[int] = []

    def waiter() -> None:
        with gate.request(1, timeout_s=30) as v:
            got.append(v)

    t = threading.Thread(target=waiter)
    t.start()
    assert got == []
    with gate.loading(1):
        pass
    t.join(30)
    assert got == [1]


def test_request_for_the_served_version_made_during_a_load_gets_the_new_one() -> None:
    """A version-free request (SkyRL's fully-async loop) that arrives while a load is under way
    runs at the version the load installs; it was refused as stale before."""
    gate = VersionGate(0)
    got: list[int] = []
    with gate.loading(1):
        t = threading.Thread(target=lambda: got.append(gate.request(None).__enter__()))
        t.start()
        t.join(0.2)
        assert got == []  # waits for the load
    t.join(30)
    assert got == [1]


def test_publish_saves_checkpoint_and_every_engine_acks_new_weights(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    engines = [HFEngine(tiny_model_dir), HFEngine(tiny_model_dir)]
    p = SamplingParams(max_new_tokens=8, temperature=0)
    before = engines[0].generate(PROMPT, p, seed=0)
    state = {k: v.clone() for k, v in engines[0].model.state_dict().items()}
    state["lm_head.weight"] = state["lm_head.weight"] + 0.5 * torch.randn_like(
        state["lm_head.weight"], generator=torch.Generator().manual_seed(0)
    )
    pub = WeightPublisher(engines, tmp_path / "ckpt", tiny_model_dir)
    pub(1, state)
    assert (tmp_path / "ckpt" / "v000001" / "model.safetensors").exists()
    assert [e.version for e in engines] == [1, 1]
    assert [a.version for a in pub.acks[1]] == [1, 1]
    after = [e.generate(PROMPT, p, seed=0, version=1) for e in engines]
    assert after[0].token_ids == after[1].token_ids
    assert after[0].logprobs != before.logprobs
    with pytest.raises(StaleRequestError):
        engines[0].generate(PROMPT, p, seed=0, version=0)
