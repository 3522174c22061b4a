from __future__ import annotations

import pytest

from thundersync.bench.simulator import (
    SimSchedule,
    Update,
    WorkItem,
    lane_completion,
    simulate,
    speedup,
    speedup_bound,
)


def _upd(items: list[tuple[float, float, float]], R: float = 4.0, P: float = 1.0) -> Update:
    return Update(tuple(WorkItem(r, p, c) for r, p, c in items), rollout_close=R, suffix=P)


def test_lane_completion_follows_the_recursion() -> None:
    # c1 = 1 + 2 = 3; c2 = max(2, 3) + 1 = 4; c3 = max(6, 4) + 0.5 = 6.5
    assert lane_completion([2.0, 1.0, 6.0], [1.0, 2.0, 0.5]) == pytest.approx(6.5)


def test_sync_releases_everything_at_rollout_close() -> None:
    u = _upd([(1.0, 1.0, 2.0), (2.0, 1.0, 2.0), (3.0, 1.0, 4.0)])
    assert simulate(u, "sync").step_s == pytest.approx(4.0 + 3.0 + 1.0)


def test_stream_hides_learner_work_behind_rollout() -> None:
    u = _upd([(1.0, 1.0, 2.0), (2.0, 1.0, 2.0), (3.0, 1.0, 4.0)])
    # stream: 1->2, 2->3, 3->4: done at R
    assert simulate(u, "stream").step_s == pytest.approx(4.0 + 1.0)
    # group: first two at 2 -> 4, third at 4 -> 5
    assert simulate(u, "group").step_s == pytest.approx(5.0 + 1.0)
    assert speedup(u) == pytest.approx(8.0 / 5.0)


def test_async_reference_is_the_two_stage_pipeline_period() -> None:
    u = _upd([(1.0, 3.0, 1.0)], R=2.0, P=0.5)
    assert simulate(u, SimSchedule.ASYNC).step_s == pytest.approx(max(2.0, 3.0 + 0.5))


def test_ranks_are_independent_lanes_and_L_is_the_busiest() -> None:
    items = (WorkItem(0.0, 2.0, 0.0, rank=0), WorkItem(0.0, 3.0, 0.0, rank=1))
    u = Update(items, rollout_close=1.0, suffix=0.0)
    assert u.learner_busy == 3.0
    assert simulate(u, "stream").step_s == pytest.approx(3.0)
    assert simulate(u, "sync").step_s == pytest.approx(4.0)


def test_bound_is_two_at_balance_without_suffix() -> None:
    assert speedup_bound(1.0, 1.0, 0.0) == 2.0
    assert speedup_bound(1.0, 3.0, 0.0) == pytest.approx(4.0 / 3.0)
