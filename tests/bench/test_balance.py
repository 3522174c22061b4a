"""`bench.balance`: the speedup bench's width search (sync probes until L equals R)."""

from __future__ import annotations

import pytest

from thundersync.bench.balance import (
    WIDTH_STEP,
    balance_width,
    first_guess,
    round_width,
    secant_width,
)


def machine(learner_per_width2: float, rollout_s: float, rollout_per_width2: float = 0.0):
    """A machine model for the search: L and R grow with width^2 at their own rates."""

    def probe(width: int) -> dict[str, float]:
        w2 = (width / 1000) ** 2
        return {"R": rollout_s + rollout_per_width2 * w2, "L": learner_per_width2 * w2, "P": 0.3}

    return probe


@pytest.mark.parametrize("learner_rate", [4.0, 6.0, 14.0, 20.0])
def test_at_most_three_probes_land_within_a_width_step_of_balance(learner_rate: float) -> None:
    probe = machine(learner_rate, rollout_s=8.0, rollout_per_width2=1.5)
    got = balance_width(1120, probe)
    assert 2 <= len(got["probes"]) <= 3
    assert got["probes"][0]["width"] == 1120

    def ratio(w: int) -> float:
        return probe(w)["L"] / probe(w)["R"]

    assert ratio(got["width"] - WIDTH_STEP) < 1.0 < ratio(got["width"] + WIDTH_STEP), got


def test_a_balanced_workload_keeps_its_width_after_one_probe() -> None:
    got = balance_width(1120, machine(8.0 / 1.12**2, rollout_s=8.0))
    assert got["width"] == 1120
    assert [p["width"] for p in got["probes"]] == [1120]


def test_a_flat_learner_curve_is_not_extrapolated() -> None:
    # L/R barely moves with the width (noise): keep the probe closest to balance
    assert secant_width([(1024, 0.70), (1216, 0.72)]) == 1216
    assert secant_width([(1024, 1.10), (960, 1.09)]) == 960


def test_the_guess_is_at_most_a_factor_two_and_on_the_width_grid() -> None:
    assert first_guess(1024, 100.0) == 512
    assert first_guess(1024, 0.01) == 2048
    assert round_width(1000) % 32 == 0
    assert round_width(10) == 256


def test_the_width_stays_within_half_and_twice_the_workloads() -> None:
    # a learner 100x too fast for its rollouts: the search stops at twice the width
    got = balance_width(1024, machine(0.05, rollout_s=8.0))
    assert got["width"] == 2048
    assert max(p["width"] for p in got["probes"]) <= 2048
