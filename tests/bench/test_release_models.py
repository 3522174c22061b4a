from __future__ import annotations

import numpy as np
import pytest

from thundersync.bench import release_models as rm
from thundersync.bench.simulator import simulate
from thundersync.bench.workloads import grpo_update, opd_update


def test_grpo_release_goes_from_zero_to_one_and_is_monotone() -> None:
    F = rm.grpo_release(0.3, 1.0, 8)
    vals = F(rm.GRID)
    assert vals[0] == 0.0 and vals[-1] == pytest.approx(1.0)
    assert np.all(np.diff(vals) >= 0)


def test_opd_releases_at_least_as_early_as_grpo() -> None:
    g = rm.grpo_release(0.1, 1.0, 8)(rm.GRID)
    o = rm.opd_release(4, 0.1, 1.0)(rm.GRID)
    assert np.all(o >= g - 1e-12)
    for rho in (0.5, 1.0, 2.0):
        assert rm.tail_of(rm.opd_release(4, 0.1, 1.0), rho) <= rm.tail_of(
            rm.grpo_release(0.1, 1.0, 8), rho
        )


def test_waves_divide_the_release_lag() -> None:
    F = rm.grpo_release(0.1, 1.0, 8)
    D = rm.lag_of(F)
    for w in (2, 4, 8):
        assert rm.lag_of(rm.waved(F, w)) == pytest.approx(D / w, rel=1e-3)


def test_uniform_release_at_balance_reaches_the_bound() -> None:
    lam = rm.tail_of(lambda u: u, 1.0)
    assert lam == pytest.approx(0.0, abs=1e-12)
    assert rm.speedup_from_tail(1.0, lam, 0.0) == pytest.approx(2.0)


def test_empirical_tail_equals_the_simulated_overrun() -> None:
    rng = np.random.default_rng(3)
    for make in (grpo_update, opd_update):
        u = make(rng, rho=float(rng.uniform(0.3, 2.5)))
        R, L = u.rollout_close, u.learner_busy
        uu, Fm = rm.empirical_release([i.ready for i in u.items], [i.service for i in u.items], R)
        lam = rm.tail(Fm, uu, L / R)
        c = simulate(u, "stream").lane_completion
        assert lam == pytest.approx(max(0.0, c - R) / R, abs=1e-9)


def test_closed_form_grpo_speedup_matches_a_large_simulation() -> None:
    rng = np.random.default_rng(0)
    sims = [
        simulate(u, "sync").step_s / simulate(u, "stream").step_s
        for u in (grpo_update(rng, groups=256, m=8) for _ in range(4))
    ]
    closed = rm.speedup_from_tail(1.0, rm.tail_of(rm.grpo_release(0.1, 1.0, 8), 1.0), 0.02)
    assert float(np.mean(sims)) == pytest.approx(closed, rel=0.03)
