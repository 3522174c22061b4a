"""The streamed update equals an independent float64 textbook gradient to 1e-12 (issue 12).

Streamed side: the project's `Learner` (boundary cuts, G1/G2 accumulators, deferred OPD adjoints)
on the tiny Llama model in float64 with `learner.accum_dtype: float64`, fed a hand-built
`LoggedBatch` through `replay_update(..., Schedule.STREAM)`; `StepStats.grad` is the normalised,
pre-clip gradient of the loss (the negated objective), flat in the order of `learner.names`.

Reference side (tests/learner/f64_reference.py): a plain-torch float64 forward read straight from
the weights file and the textbook losses with one backward; it shares no model or loss code with
the project.

Stock HF Llama computes RMSNorm, the RoPE tables and the eager softmax in float32 even when the
model is float64 (agreement stalls near 1e-7), so the `true_float64` fixture patches those three to
compute in the input dtype for the streamed side, and `test_patched_hf_model_is_truly_float64`
proves the patch takes effect.

Criterion: `||g_stream - g_ref|| / ||g_ref|| <= 1e-12`. Where the textbook gradient is exactly
zero (a batch of size-1 groups, an equal-reward group), every term is an exact zero advantage
times a finite gradient, so no rounding can make it nonzero: the streamed gradient must then be
exactly zero too (every coordinate == 0.0), which is stricter than any norm threshold.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from f64_reference import (
    forward_logits,
    load_params,
    perturb_norms,
    read_config,
    reference_grad,
    textbook_advantages,
)
from transformers import LlamaForCausalLM

from thundersync.config import Objective, RunConfig, Schedule, load_run_config
from thundersync.hf_models import build_tiny_model
from thundersync.learner.batch_replay import LoggedBatch, replay_update
from thundersync.learner.sources import GrpoContent, GrpoGroupSpec, GrpoReward, OpdClose, OpdTurn
from thundersync.learner.trainer import Learner

REL_TOL = 1e-12
VOCAB_LO = 8  # token ids from here up: never the pad token, whose embedding row HF never trains


# ---- the model, made truly float64 ---------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama (hidden 64, 2 layers) whose RMSNorm weights are perturbed away from 1.

    `build_tiny_model` leaves every norm weight at exactly 1, which would let a forward that
    forgets a norm weight pass; both sides read the same rewritten weights file.
    """
    out = build_tiny_model(tmp_path_factory.mktemp("f64") / "model", seed=5, hidden=64, layers=2)
    return perturb_norms(out, seed=11)


def _hf_model(model_dir: Path, dtype: torch.dtype) -> LlamaForCausalLM:
    """The stock HF model on the weights file, eager attention (the one `true_float64` patches)."""
    model = LlamaForCausalLM.from_pretrained(
        str(model_dir), dtype=dtype, attn_implementation="eager"
    )
    model.eval()
    return model


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


# ---- sanity: the reference forward is the HF model's forward -------------------------------------
def _probe_ids(n: int = 14, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(VOCAB_LO, 512) for _ in range(n)]


def test_reference_forward_reproduces_hf_logits_in_float32(model_dir: Path) -> None:
    """The independent forward is the same function as stock HF Llama (fp32, ~1e-5)."""
    ids = _probe_ids()
    with torch.no_grad():
        hf = _hf_model(model_dir, torch.float32)(input_ids=torch.tensor([ids])).logits[0]
        ref = forward_logits(load_params(model_dir, torch.float32), read_config(model_dir), ids)
    assert hf.dtype == ref.dtype == torch.float32
    err = float((hf - ref).abs().max() / hf.abs().max())
    assert err < 1e-5, err


def test_patched_hf_model_is_truly_float64(model_dir: Path, true_float64: None) -> None:
    """With the patch, HF float64 logits equal the float64 reference to ~1e-15, not the ~1e-7 of
    stock HF (fp32 norm / RoPE / softmax): the streamed side really runs in float64."""
    ids = _probe_ids(seed=1)
    with torch.no_grad():
        hf = _hf_model(model_dir, torch.float64)(input_ids=torch.tensor([ids])).logits[0]
        ref = forward_logits(load_params(model_dir, torch.float64), read_config(model_dir), ids)
    assert hf.dtype == ref.dtype == torch.float64
    err = float((hf - ref).norm() / ref.norm())
    assert err < 1e-13, err


def test_textbook_advantages_of_equal_rewards_far_from_zero_are_exactly_zero() -> None:
    """Shifting by the first reward makes an equal-reward group's advantages exact zeros."""
    for est in ("grpo", "dr_grpo", "rloo"):
        assert textbook_advantages(est, [1e6 + 0.3] * 3, 1e-6) == [0.0, 0.0, 0.0]


# ---- hand-built batches --------------------------------------------------------------------------
@dataclass(frozen=True)
class Traj:
    """One GRPO trajectory: response length, reward, and which response tokens are unscored."""

    length: int
    reward: float
    unscored: tuple[int, ...] = ()


@dataclass(frozen=True)
class Group:
    prompt_len: int
    trajs: tuple[Traj, ...]


def grpo_batch(groups: Sequence[Group], seed: int) -> LoggedBatch:
    """Groups with their specs, content and reward events; rewards may arrive before content."""
    rng = random.Random(seed)
    b = LoggedBatch(Objective.GRPO)
    for gi, g in enumerate(groups):
        gid = f"g{gi}"
        prompt = tuple(rng.randrange(VOCAB_LO, 512) for _ in range(g.prompt_len))
        b.groups.append(GrpoGroupSpec(gid, prompt, len(g.trajs)))
        for i, t in enumerate(g.trajs):
            resp = tuple(rng.randrange(VOCAB_LO, 512) for _ in range(t.length))
            mask = tuple(0 if k in t.unscored else 1 for k in range(t.length))
            b.events.append((rng.uniform(0, 10), GrpoContent(f"{gid}/t{i}", gid, i, resp, mask)))
            b.events.append((rng.uniform(0, 12), GrpoReward(f"{gid}/r{i}", gid, i, t.reward)))
    b.events.sort(key=lambda e: e[0])
    return b


# segments of one OPD trajectory: (unscored context tokens, scored action tokens) per turn
OpdSpec = Sequence[tuple[int, int]]


def opd_batch(trajectories: Sequence[OpdSpec], seed: int) -> LoggedBatch:
    """Trajectories of turns; teacher log-probs are given data (one per scored token)."""
    rng = random.Random(seed)
    b = LoggedBatch(Objective.OPD)
    for ti, turns in enumerate(trajectories):
        tid = f"o{ti}"
        b.trajectories.append(tid)
        t = rng.uniform(0, 2)
        for j, (n_ctx, n_act) in enumerate(turns):
            toks = tuple(rng.randrange(VOCAB_LO, 512) for _ in range(n_ctx + n_act))
            mask = (0,) * n_ctx + (1,) * n_act
            teacher = tuple(-rng.uniform(0.5, 7.0) for _ in range(n_act))
            t += rng.uniform(0.5, 3)
            b.events.append((t, OpdTurn(f"{tid}/turn{j}", tid, j, toks, mask, teacher)))
        b.events.append((t + rng.uniform(0, 1), OpdClose(f"{tid}/close", tid, len(turns))))
    b.events.sort(key=lambda e: e[0])
    return b


_MIXED = [
    Group(6, (Traj(5, 1.0, (1, 3)), Traj(3, 0.2), Traj(7, -0.4))),
    Group(1, (Traj(4, 0.0), Traj(5, 1.0, (0,)))),  # one-token prompt: no prompt K/V cut
    Group(4, (Traj(5, 1e6 + 0.3), Traj(3, 1e6 + 0.3), Traj(4, 1e6 + 0.3))),  # equal, far
    Group(3, (Traj(6, 1e6 + 1.0), Traj(4, 1e6 - 0.5, (0, 1)), Traj(3, 1e6 + 0.25))),
    Group(5, (Traj(4, 3.0),)),  # size 1 inside a mixed batch
    Group(2, (Traj(3, 0.5, (0, 1, 2)), Traj(5, -0.5))),  # a trajectory with nothing scored
]
GRPO_LAYOUTS: dict[str, list[Group]] = {
    # a lone trajectory per group: r_i - mu = 0, so the textbook gradient is exactly zero
    "size1": [Group(4, (Traj(5, 0.7),)), Group(3, (Traj(4, -2.0, (1,)),))],
    "size2": [Group(5, (Traj(6, 1.0, (2,)), Traj(4, 0.0)))],
    # m = 3, all rewards 1e6 + 0.3: the group's contribution must be exactly 0
    "equal_1e6": [Group(4, (Traj(5, 1e6 + 0.3), Traj(3, 1e6 + 0.3, (0,)), Traj(6, 1e6 + 0.3)))],
    # groups of sizes 1-3, offsets 0 and 1e6, an equal-reward group, unscored tokens
    "mixed": _MIXED,
    # the same without its size-1 group, for rloo (m >= 2)
    "mixed_m2": [g for g in _MIXED if len(g.trajs) >= 2],
}
ZERO_LAYOUTS = {"size1", "equal_1e6"}


def _grpo_cases() -> Iterator[Any]:
    # SkyRL's estimator (grpo_sample_std) and reduction (token_mean, over token_sum weights)
    for case in (
        ("mixed", "grpo", "token_sum", "token_mean"),
        ("size1", "grpo", "token_sum", "token_mean"),
        ("mixed", "grpo_sample_std", "seq_mean", "mean"),
        ("mixed", "grpo_sample_std", "token_sum", "token_mean"),
        ("size2", "grpo_sample_std", "token_sum", "default"),
    ):
        yield pytest.param(*case, id="-".join(case))
    for layout, groups in GRPO_LAYOUTS.items():
        for est in ("grpo", "dr_grpo", "rloo"):
            if est == "rloo" and layout in ("size1", "mixed"):
                continue  # rloo needs m >= 2 in every group
            if layout == "mixed_m2" and est != "rloo":
                continue  # mixed_m2 is mixed minus its size-1 group, only for rloo
            # the reduction matters only with several groups; else the config default (sum)
            reductions = ("sum", "mean") if len(groups) > 1 else ("default",)
            for weighting in ("seq_mean", "token_sum"):
                for red in reductions:
                    case_id = f"{layout}-{est}-{weighting}-{red}"
                    yield pytest.param(layout, est, weighting, red, id=case_id)


def _config(objective: str, **learner: object) -> RunConfig:
    return load_run_config(
        data={
            "objective": objective,
            "optim": {"max_grad_norm": 1e9},  # no clipping (StepStats.grad is pre-clip anyway)
            "learner": {"accum_dtype": "float64", **learner},
        }
    )


def _stream(model_dir: Path, cfg: RunConfig, batch: LoggedBatch) -> tuple[torch.Tensor, list[str]]:
    learner = Learner(_hf_model(model_dir, torch.float64), cfg)
    assert all(p.dtype == torch.float64 for p in learner.params)
    stats = replay_update(learner, batch, Schedule.STREAM)
    assert stats.grad.dtype == torch.float64
    return stats.grad, list(learner.names)


@pytest.mark.parametrize(("layout", "estimator", "weighting", "reduction"), list(_grpo_cases()))
def test_grpo_stream_equals_float64_textbook_gradient(
    model_dir: Path,
    true_float64: None,
    layout: str,
    estimator: str,
    weighting: str,
    reduction: str,
) -> None:
    """The streamed GRPO update is the textbook sum (or mean) over groups of
    (1/m) sum_i A_i grad S_i, negated, to 1e-12; exactly zero where the textbook one is."""
    extra = {} if reduction == "default" else {"group_reduction": reduction}
    cfg = _config("grpo", estimator=estimator, token_weighting=weighting, **extra)
    batch = grpo_batch(GRPO_LAYOUTS[layout], seed=len(layout))
    got, names = _stream(model_dir, cfg, batch)
    lc = cfg.learner
    ref = reference_grad(
        model_dir,
        batch,
        names,
        objective="grpo",
        estimator=str(lc.estimator),
        eps=lc.std_eps,
        token_weighting=lc.token_weighting,
        group_reduction=str(lc.group_reduction),
    )
    if layout in ZERO_LAYOUTS:
        assert not ref.any(), "the textbook gradient of this batch is exactly zero"
        assert not got.any(), f"streamed gradient should be exactly 0, has norm {float(got.norm())}"
        return
    err = _rel_err(got, ref)
    assert err <= REL_TOL, f"relative error {err:.3e}"


# `learner.grpo_sum: float64` fixes c = 0 before any reward: a group at r ~ 1e6 then carries
# |r - c| / spread * 1e-16 (~1e-10 here) instead of the first-reward shift's ~1e-16; elsewhere 1e-12
F64_SUM_TOL = {"mixed": 1e-9, "mixed_m2": 1e-9}


_F64_SUM_CASES = [
    pytest.param(layout, est, shuffle, id=f"{layout}-{est}-{'reordered' if shuffle else 'logged'}")
    for layout in GRPO_LAYOUTS
    for est in ("grpo", "grpo_sample_std", "dr_grpo", "rloo")
    for shuffle in (0, 1)
    if not (est == "rloo" and layout in ("size1", "mixed"))  # rloo needs m >= 2 in every group
]


@pytest.mark.parametrize(("layout", "estimator", "shuffle"), _F64_SUM_CASES)
def test_order_independent_grpo_sum_equals_float64_textbook_gradient(
    model_dir: Path, true_float64: None, layout: str, estimator: str, shuffle: int
) -> None:
    """Under `grpo_sum: float64` (shift fixed at 0, not a reward) an equal-reward group and lone
    members still give exactly 0 for every estimator, and any arrival order the textbook sum."""
    cfg = _config("grpo", estimator=estimator, grpo_sum="float64")
    batch = grpo_batch(GRPO_LAYOUTS[layout], seed=len(layout))
    batch = batch.shuffled(shuffle) if shuffle else batch
    got, names = _stream(model_dir, cfg, batch)
    ref = reference_grad(
        model_dir, batch, names, objective="grpo", estimator=estimator, eps=cfg.learner.std_eps
    )
    lone_raw = estimator == "grpo_sample_std" and layout == "size1"  # r / (1 + eps) each
    if layout in ZERO_LAYOUTS and not lone_raw:
        assert not ref.any() and not got.any(), f"norm {float(got.norm())}, should be exactly 0"
        return
    err = _rel_err(got, ref)
    assert err <= F64_SUM_TOL.get(layout, REL_TOL), f"relative error {err:.3e}"


OPD_LAYOUTS: dict[str, list[list[tuple[int, int]]]] = {
    "multi_turn": [[(5, 4), (2, 3), (3, 5)], [(4, 2), (1, 4), (2, 2), (3, 3)], [(6, 3), (2, 4)]],
    # a middle turn with no scored token (its K/V still feed later turns) and a scoreless prompt
    "zero_scored_turn": [[(4, 3), (3, 0), (2, 4)], [(5, 0), (2, 3), (1, 2)]],
    "single_turn": [[(5, 4)], [(3, 6)], [(7, 2)]],
    "mixed": [[(4, 5)], [(3, 2), (2, 0), (4, 3)], [(6, 3), (1, 1), (2, 5)]],
}


@pytest.mark.parametrize("layout", list(OPD_LAYOUTS))
def test_opd_stream_equals_float64_textbook_gradient(
    model_dir: Path, true_float64: None, layout: str
) -> None:
    """The streamed OPD update is -(1/N) sum_t stopgrad(log pi_T - log pi) grad log pi over every
    scored token of the batch (deferred adjoints of earlier turns included), to 1e-12."""
    batch = opd_batch(OPD_LAYOUTS[layout], seed=len(layout))
    got, names = _stream(model_dir, _config("opd"), batch)
    ref = reference_grad(model_dir, batch, names, objective="opd")
    err = _rel_err(got, ref)
    assert err <= REL_TOL, f"relative error {err:.3e}"
