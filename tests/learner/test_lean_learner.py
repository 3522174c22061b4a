"""The lean learner (issue 13): chunked head, in-place accumulators, checkpointing, OPD modes,
admission by bytes. Each exactness check compares with plain torch, not with the engine itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from thundersync.config import RunConfig, Schedule, load_run_config
from thundersync.hf_models import load_model
from thundersync.learner.accumulators import BufferPool, FlatSpec, add_into
from thundersync.learner.batch_replay import LoggedBatch, replay_sources
from thundersync.learner.logprobs import scored_logprobs
from thundersync.learner.trainer import Learner


def _cfg(objective: str = "grpo", **learner: object) -> RunConfig:
    return load_run_config(
        data={"objective": objective, "optim": {"max_grad_norm": 1e9}, "learner": learner}
    )


class _Head(nn.Module):
    def __init__(self, d: int, v: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.lm_head = nn.Linear(d, v, bias=True, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("chunk", [1, 3, 1024])
def test_chunked_head_matches_plain_log_softmax_in_value_and_gradient(
    dtype: torch.dtype, chunk: int
) -> None:
    torch.manual_seed(0)
    model = _Head(8, 37, dtype)
    hidden = torch.randn(11, 8, dtype=dtype, requires_grad=True)
    ids = torch.randint(0, 37, (11,))
    scored = torch.tensor([True, False, True, True, False, False, True, True, True, False])
    w = torch.randn(int(scored.sum()), dtype=dtype)
    got = scored_logprobs(model, hidden, ids, scored, chunk=chunk)
    (got * w).sum().backward()
    g_h, g_w, g_b = hidden.grad, model.lm_head.weight.grad, model.lm_head.bias.grad
    assert g_h is not None and g_w is not None and g_b is not None
    hidden.grad = None
    model.lm_head.zero_grad()
    # textbook: every position's logits, log_softmax, gather, then keep the scored rows
    logp = torch.log_softmax(model.lm_head(hidden)[:-1], -1).gather(-1, ids[1:, None])[:, 0]
    want = logp[scored]
    (want * w).sum().backward()
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert torch.allclose(got, want, atol=tol, rtol=0)
    assert torch.allclose(g_h, hidden.grad, atol=tol, rtol=0)  # type: ignore[arg-type]
    assert torch.allclose(g_w, model.lm_head.weight.grad, atol=tol, rtol=0)  # type: ignore[arg-type]
    assert torch.allclose(g_b, model.lm_head.bias.grad, atol=tol, rtol=0)  # type: ignore[arg-type]


def test_chunked_head_never_builds_logits_for_unscored_positions() -> None:
    model = _Head(4, 50, torch.float32)
    calls: list[int] = []
    real = torch.nn.functional.linear

    def spy(x: torch.Tensor, *a: object) -> torch.Tensor:
        calls.append(x.shape[0])
        return real(x, *a)  # type: ignore[arg-type]

    torch.nn.functional.linear = spy  # type: ignore[assignment]
    try:
        scored = torch.zeros(99, dtype=torch.bool)
        scored[[3, 50, 97]] = True
        scored_logprobs(model, torch.randn(100, 4), torch.randint(0, 50, (100,)), scored, chunk=2)
    finally:
        torch.nn.functional.linear = real
    assert calls == [2, 1]  # 3 scored rows in chunks of 2, never the 100 positions


def test_accumulators_add_in_place_across_dtypes_and_recycle_buffers() -> None:
    params = [torch.zeros(3, 2), torch.zeros(5)]
    spec = FlatSpec(params)
    pool = BufferPool("cpu")
    a = pool.acquire(spec.total, torch.float64)
    views = spec.unflatten(a)
    g = [torch.full((3, 2), 0.1), None]
    add_into(views, g, alpha=3.0)
    add_into(views, [torch.ones(3, 2), torch.ones(5)])
    assert torch.allclose(a[:6], torch.full((6,), 1.3, dtype=torch.float64))
    assert torch.equal(a[6:], torch.ones(5, dtype=torch.float64))
    assert a.data_ptr() == views[0].data_ptr()  # views, not copies
    assert pool.held_bytes == 11 * 8
    pool.release(a)
    b = pool.acquire(spec.total, torch.float64)
    assert b.data_ptr() == a.data_ptr() and not b.any()  # recycled and zeroed
    assert pool.allocations == 1


def test_pool_gives_idle_buffers_of_other_sizes_back_before_allocating() -> None:
    """The update's float64 sum comes after the fp32 group buffers are spent: the idle fp32
    buffers are released before it is allocated (their memory is its), same-key ones are kept."""
    pool = BufferPool("cpu")
    a, b = pool.acquire(1000, torch.float32), pool.acquire(1000, torch.float32)
    pool.release(a)
    c = pool.acquire(1000, torch.float32)  # same key: recycled, nothing dropped
    assert c.data_ptr() == a.data_ptr() and pool.allocations == 2
    pool.release(b)
    pool.release(c)
    wide = pool.acquire(1000, torch.float64)
    assert pool.allocations == 3 and pool.held_bytes == 8000
    assert not any(pool._free.values())  # the two idle fp32 buffers went back
    pool.release(wide)
    again = pool.acquire(1000, torch.float64)  # recycled again
    assert again.data_ptr() == wide.data_ptr() and pool.allocations == 3


def _grads(learner: Learner, batch: LoggedBatch, **_: object) -> torch.Tensor:
    engine = replay_sources(learner, batch, Schedule.STREAM)
    return engine.acc.grad.clone()


@pytest.mark.parametrize("mode", ["segment", "layer", True])
@pytest.mark.parametrize("objective", ["grpo", "opd"])
def test_activation_checkpointing_gives_the_same_gradient(
    objective: str,
    mode: str | bool,
    tiny_model_dir: Path,
    grpo_batch: LoggedBatch,
    opd_batch: LoggedBatch,
) -> None:
    """Whole-segment and per-layer recompute (the latter replays each layer's cache update) give
    the plain gradient; `true` is the segment mode of recipes written before `layer`."""
    batch = grpo_batch if objective == "grpo" else opd_batch
    plain = _grads(Learner(load_model(tiny_model_dir), _cfg(objective)), batch)
    cfg = _cfg(objective, activation_checkpointing=mode)
    assert cfg.learner.activation_checkpointing == ("segment" if mode is True else mode)
    ckpt = _grads(Learner(load_model(tiny_model_dir), cfg), batch)
    assert torch.allclose(plain, ckpt, rtol=0, atol=1e-12 * float(plain.abs().max()))


def test_opd_recompute_mode_equals_keep_mode_and_recomputes_each_read_turn(
    tiny_model_dir: Path, opd_batch: LoggedBatch
) -> None:
    keep = Learner(load_model(tiny_model_dir), _cfg("opd", opd_turn_graphs="keep"))
    rec = Learner(load_model(tiny_model_dir), _cfg("opd", opd_turn_graphs="recompute"))
    assert keep.keep_turn_graphs and not rec.keep_turn_graphs
    e_keep = replay_sources(keep, opd_batch, Schedule.STREAM)
    e_rec = replay_sources(rec, opd_batch, Schedule.STREAM)
    assert torch.equal(e_keep.acc.grad, e_rec.acc.grad)
    assert e_rec.counters["turn_recomputes"] == e_rec.counters["deferred_propagations"] > 0
    assert e_keep.counters["turn_recomputes"] == 0


def test_auto_turn_graphs_keep_on_cpu(tiny_model_dir: Path) -> None:
    assert Learner(load_model(tiny_model_dir), _cfg("opd")).keep_turn_graphs


def test_admission_by_bytes_holds_one_group_at_a_time_and_still_finishes(
    tiny_model_dir: Path, grpo_batch: LoggedBatch
) -> None:
    free = Learner(load_model(tiny_model_dir), _cfg(max_open_groups=8))
    e_free = replay_sources(free, grpo_batch, Schedule.STREAM)
    vec = e_free.spec.total * 4
    # room for one open group's G1 and G2 (+ a little), not for two groups at once
    capped = Learner(load_model(tiny_model_dir), _cfg(max_open_groups=8, max_held_bytes=3 * vec))
    e_cap = replay_sources(capped, grpo_batch, Schedule.STREAM)
    assert e_free.peak_open > 1
    assert e_cap.peak_open == 1 and e_cap.counters["admission_bytes_waits"] > 0
    # the update's fp64 sum (2 vectors, from the first close) + one group's G1, G2 + the H_i
    # held for late rewards (this batch sends rewards after contents); nothing else full-size
    held = e_cap.counters["held_peak"]
    assert e_cap.pool.peak_held_bytes <= (2 + 2 + held) * vec + e_cap.spec.total
    assert torch.allclose(e_free.acc.grad, e_cap.acc.grad, rtol=0, atol=1e-12)
    assert not e_cap.open_sources()


def test_narrowing_in_place_equals_a_plain_cast_and_reuses_the_storage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import thundersync.learner.accumulators as acc

    monkeypatch.setattr(acc, "_CHUNK", 7)  # many chunks, including ones that overlap their input
    v = torch.randn(1001, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 1e3
    want = v.float()
    ptr = v.data_ptr()
    got = acc.narrow_in_place(v, torch.float32)
    assert torch.equal(got, want) and got.data_ptr() == ptr
