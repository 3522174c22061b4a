"""An OPD turn run in segments of at most S tokens (`learner.opd_segment_tokens`) stays exact.

Each segment runs on the K/V of everything before it (earlier turns and the earlier segments of
its own turn); its last hidden row scores the first token of the next segment, across the cut.
Checked against the independent float64 reference (tests/learner/f64_reference.py) to 1e-12 and
against the unsegmented engine (gradient and metrics), with kept and with recomputed turn graphs.
Also: a bad turn is refused before any segment touches the trajectory, and the K/V store's hooks
add each past leaf's adjoint into the ledger current when they fire (after a regrowth too) and
free the leaf's grad at once.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from f64_reference import perturb_norms, reference_grad
from transformers import LlamaForCausalLM

from thundersync.config import ConfigError, Objective, RunConfig, Schedule, load_run_config
from thundersync.hf_models import build_tiny_model
from thundersync.learner.batch_replay import LoggedBatch, replay_sources
from thundersync.learner.engine import GradientEngine
from thundersync.learner.engine_core import SourceError
from thundersync.learner.sources import OpdClose, OpdTurn
from thundersync.learner.trainer import Learner
from thundersync.plan import activations as act
from thundersync.plan.advice import refuse
from thundersync.plan.memory import GB, Machine, MemoryPlan, plan_memory
from thundersync.plan.shape import load_shape

REL_TOL = 1e-12
VOCAB_LO = 8  # never the pad token, whose embedding row HF never trains

# each turn's action mask (1: scored). With S = 3: the first turn's cut at 3 falls right before a
# scored token, 13- and 7-token turns end in a 1-token segment; S = 5: the 11-token turn does
TRAJS = [
    ["00" + "1" * 10, "0001101111100", "0" + "1" * 10],
    ["0000000", "01", "0", "00111111110111"],  # a scoreless prompt, a 1-token turn
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama with its RMSNorm weights perturbed away from 1 (as test_float64_reference)."""
    out = build_tiny_model(tmp_path_factory.mktemp("seg") / "model", seed=7, hidden=64, layers=2)
    return perturb_norms(out, seed=13)


def _batch(seed: int = 3) -> LoggedBatch:
    """The trajectories interleaved; teacher and engine log-probs are given data per scored token."""
    rng = random.Random(seed)
    b = LoggedBatch(Objective.OPD)
    for ti, turns in enumerate(TRAJS):
        tid = f"o{ti}"
        b.trajectories.append(tid)
        for j, m in enumerate(turns):
            mask = tuple(int(c) for c in m)
            toks = tuple(rng.randrange(VOCAB_LO, 512) for _ in mask)
            teacher = tuple(-rng.uniform(0.5, 7.0) for _ in range(sum(mask)))
            engine_lp = tuple(-rng.uniform(0.5, 7.0) for _ in range(sum(mask)))
            item = OpdTurn(f"{tid}/turn{j}", tid, j, toks, mask, teacher, None, engine_lp)
            b.events.append((j + 0.5 * ti, item))
        b.events.append((len(turns) + 0.5 * ti, OpdClose(f"{tid}/close", tid, len(turns))))
    b.events.sort(key=lambda e: e[0])
    return b


def _segments(s: int) -> int:
    return sum(-(-len(m) // s) for turns in TRAJS for m in turns)


def _config(segment_tokens: int | None, graphs: str) -> RunConfig:
    learner = {"accum_dtype": "float64", "opd_turn_graphs": graphs}
    return load_run_config(
        data={
            "objective": "opd",
            "optim": {"max_grad_norm": 1e9},  # no clipping (StepStats.grad is pre-clip anyway)
            "learner": learner | {"opd_segment_tokens": segment_tokens},
        }
    )


def _learner(model_dir: Path, cfg: RunConfig) -> Learner:
    model = LlamaForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float64, attn_implementation="eager"
    )
    model.eval()
    return Learner(model, cfg)


def _run(
    model_dir: Path, segment_tokens: int | None, graphs: str
) -> tuple[torch.Tensor, list[str], GradientEngine]:
    learner = _learner(model_dir, _config(segment_tokens, graphs))
    engine = replay_sources(learner, _batch(), Schedule.STREAM)
    grad = learner.step(engine).grad
    assert grad.dtype == torch.float64
    return grad, list(learner.names), engine


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("graphs", ["keep", "recompute"])
@pytest.mark.parametrize("segment_tokens", [1, 3, 5])
def test_segmented_opd_turns_give_the_float64_reference_gradient(
    model_dir: Path, true_float64: None, segment_tokens: int, graphs: str
) -> None:
    """-(1/N) sum_t stopgrad(log pi_T - log pi) grad log pi over every scored token, to 1e-12,
    with each turn cut into segments of S tokens (the cuts really happen: one forward each)."""
    got, names, engine = _run(model_dir, segment_tokens, graphs)
    assert engine.counters["turn_forwards"] == _segments(segment_tokens)
    if graphs == "recompute":
        assert engine.counters["turn_recomputes"] > 0
    ref = reference_grad(model_dir, _batch(), names, objective="opd")
    err = _rel_err(got, ref)
    assert err <= REL_TOL, f"relative error {err:.3e}"


@pytest.mark.parametrize("graphs", ["keep", "recompute"])
@pytest.mark.parametrize("segment_tokens", [3, 5])
def test_segmented_opd_equals_the_unsegmented_engine_gradient_kl_and_mismatch(
    model_dir: Path, true_float64: None, segment_tokens: int, graphs: str
) -> None:
    """Same gradient (to rounding), KL / surrogate-loss sums and engine-mismatch metric."""
    got, _, seg = _run(model_dir, segment_tokens, graphs)
    want, _, whole = _run(model_dir, None, graphs)
    assert whole.counters["turn_forwards"] == sum(len(t) for t in TRAJS)
    err = _rel_err(got, want)
    assert err <= REL_TOL, f"relative error {err:.3e}"
    scored = sum(m.count("1") for turns in TRAJS for m in turns)
    a, b = seg.opd.stats, whole.opd.stats
    assert a.tokens == b.tokens == scored
    assert a.kl_sum == pytest.approx(b.kl_sum, rel=REL_TOL)
    assert a.loss_sum == pytest.approx(b.loss_sum, rel=REL_TOL)
    assert seg.mismatch.tokens == whole.mismatch.tokens == scored
    assert seg.mismatch.total == pytest.approx(whole.mismatch.total, rel=REL_TOL)
    assert seg.mismatch.max == pytest.approx(whole.mismatch.max, rel=REL_TOL)


def test_segments_no_shorter_than_every_turn_are_the_unsegmented_engine_bit_for_bit(
    model_dir: Path, true_float64: None
) -> None:
    """S at least a turn's length runs the turn whole: the very same floating-point work."""
    got, _, seg = _run(model_dir, 64, "recompute")
    want, _, _ = _run(model_dir, None, "recompute")
    assert seg.counters["turn_forwards"] == sum(len(t) for t in TRAJS)
    assert torch.equal(got, want)


def _trajectory_state(engine: GradientEngine) -> tuple[object, ...]:
    t = engine.opd.trajs["o0"]
    bufs = [x.clone() for layer in t.store.kv + t.store.ledger for x in layer]
    counts = (t.pos, t.next_turn, len(t.turns), t.scored, t.kl_sum, t.store.length)
    return t.acc.flat.clone(), bufs, counts, engine.counters["turn_forwards"]


@pytest.mark.parametrize("off_by", [-1, 1])
def test_a_turn_with_the_wrong_teacher_count_leaves_sum_store_and_position_unchanged(
    model_dir: Path, off_by: int
) -> None:
    """Refused whole before its first segment runs: neither too few teacher log-probs (which the
    last segment alone would notice) nor too many (which slicing would silently drop) pass."""
    engine = _learner(model_dir, _config(3, "keep")).open_update(Schedule.STREAM)
    engine.register_trajectory("o0")
    rng = random.Random(1)
    mask = (0, 0, 1, 1, 1, 0, 1, 1)
    toks = tuple(rng.randrange(VOCAB_LO, 512) for _ in mask)
    engine.opd.turn(OpdTurn("o0/turn0", "o0", 0, toks, mask, (-1.0,) * 5))
    before = _trajectory_state(engine)
    teacher = (-2.0,) * (5 + off_by)
    with pytest.raises(SourceError, match="teacher log-probs"):
        engine.opd.turn(OpdTurn("o0/turn1", "o0", 1, toks, mask, teacher))
    after = _trajectory_state(engine)
    assert torch.equal(before[0], after[0])
    assert all(torch.equal(x, y) for x, y in zip(before[1], after[1], strict=True))
    assert before[2:] == after[2:]


def test_opd_segment_tokens_must_be_positive_and_the_error_names_the_field() -> None:
    assert load_run_config(data={"objective": "opd"}).learner.opd_segment_tokens is None
    assert _config(4, "keep").learner.opd_segment_tokens == 4
    for bad in (0, -3):
        with pytest.raises((ConfigError, ValueError), match=r"learner\.opd_segment_tokens"):
            _config(bad, "keep")


def test_opd_segment_tokens_reaches_the_opd_engine(model_dir: Path) -> None:
    engine = _learner(model_dir, _config(4, "recompute")).open_update(Schedule.STREAM)
    assert engine.opd.segment_tokens == 4


# ---- the memory plan -----------------------------------------------------------------------------
def _plan_8b_131k(seg: int | None) -> tuple[RunConfig, MemoryPlan, int]:
    over = {
        "rollout.max_total_tokens": 131072,
        "learner.max_open_groups": 1,
        "learner.activation_checkpointing": "layer",
        "learner.opd_turn_graphs": "recompute",
        "learner.opd_segment_tokens": seg,
    }
    cfg = load_run_config("opd-qwen3-32b", over)
    plan = plan_memory(cfg, load_shape("qwen3-8b"), Machine(8, 141 * GB, 2048 * GB))
    acts = sum(c.bytes for c in plan.components if c.name.startswith("activations"))
    return cfg, plan, acts


def test_plan_counts_opd_activations_of_s_tokens_and_the_refusal_offers_opd_segment_tokens() -> (
    None
):
    """131k-token OPD on an 8B model: a whole turn's activations do not fit an H200; S tokens
    of own activations on the rest as past K/V do, and the refusal names the largest S that fits."""
    cfg, whole, acts = _plan_8b_131k(None)
    assert not whole.fits
    why = refuse(whole, cfg)
    assert why is not None and "learner.opd_segment_tokens=" in why, why
    best = int(why.split("learner.opd_segment_tokens=")[1].split(",")[0].split(" ")[0])
    _, fits, seg_acts = _plan_8b_131k(best)
    assert fits.fits and seg_acts < acts
    assert not _plan_8b_131k(best + 1)[1].fits
    assert _plan_8b_131k(131072)[2] == acts  # S >= T: a whole turn, as unsegmented
    s, t = load_shape("qwen3-8b"), 131072
    one = act.worst_segment(s, 2, t, True, True, most_own=1)
    assert one == act.segment_bytes(s, 2, 1, t - 1, True, True)
    adj = [c.bytes for c in fits.components if c.name.startswith("OPD past-leaf adjoint")]
    assert adj == [t * 2 * s.kv_dim * 2]  # one layer's K and V grads in bf16, not every layer's
