"""Hypothesis properties of the simulator and the closed forms."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from thundersync.bench import release_models as rm
from thundersync.bench.simulator import Update, WorkItem, simulate, speedup_bound

item = st.tuples(
    st.floats(0.0, 10.0), st.floats(0.001, 5.0), st.floats(0.0, 5.0), st.integers(0, 2)
)


@st.composite
def updates(draw: st.DrawFn) -> Update:
    raw = draw(st.lists(item, min_size=1, max_size=30))
    items = tuple(WorkItem(r, p, r + extra, rank) for r, p, extra, rank in raw)
    R = max(it.group_close for it in items) + draw(st.floats(0.0, 2.0))
    return Update(items, rollout_close=R, suffix=draw(st.floats(0.0, 5.0)))


@settings(max_examples=150, deadline=None)
@given(updates())
def test_no_schedule_beats_the_bound(u: Update) -> None:
    sync = simulate(u, "sync").step_s
    b = speedup_bound(u.rollout_close, u.learner_busy, u.suffix)
    assert b <= 2.0 + 1e-12
    for s in ("stream", "group"):
        assert sync / simulate(u, s).step_s <= b * (1 + 1e-9)


@settings(max_examples=150, deadline=None)
@given(updates())
def test_stream_is_never_slower_than_group_nor_group_than_sync(u: Update) -> None:
    t = {s: simulate(u, s).step_s for s in ("stream", "group", "sync")}
    assert t["stream"] <= t["group"] + 1e-9
    assert t["group"] <= t["sync"] + 1e-9


def _step_release(data: st.DataObject, grid: np.ndarray) -> np.ndarray:
    incs = data.draw(st.lists(st.floats(0.0, 1.0), min_size=len(grid), max_size=len(grid)))
    F = np.cumsum(incs)
    return F / F[-1] if F[-1] > 0 else np.linspace(0.0, 1.0, len(grid))


@settings(max_examples=150, deadline=None)
@given(st.data(), st.floats(0.05, 4.0))
def test_tail_is_rho_lipschitz_in_the_release_function(data: st.DataObject, rho: float) -> None:
    u = np.linspace(0.0, 1.0, 17)
    F = _step_release(data, u)
    G = _step_release(data, u)
    gap = rm.tail(F, u, rho) - rm.tail(G, u, rho)
    assert abs(gap) <= rho * float(np.max(np.abs(F - G))) + 1e-12


@settings(max_examples=150, deadline=None)
@given(st.data(), st.floats(0.05, 4.0))
def test_tail_stays_within_its_bounds(data: st.DataObject, rho: float) -> None:
    u = np.linspace(0.0, 1.0, 17)
    F = _step_release(data, u)
    F[0] = 0.0  # nothing is released before the update starts
    lam = rm.tail(F, u, rho)
    lo, hi = rm.tail_bounds(rho, rm.release_lag(F, u))
    assert lo - 1e-12 <= lam <= hi + 1e-12
