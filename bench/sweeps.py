"""The trend sweeps behind `tsrl bench simulate`: each returns plain numbers (for the table, the
plots and the JSON line); nothing here prints or plots."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from thundersync.bench import release_models as rm
from thundersync.bench.simulator import SimSchedule, Update, simulate, speedup_bound
from thundersync.bench.workloads import grpo_update, opd_update

HETEROGENEITY = (0.1, 0.25, 0.5, 0.75, 1.0)
WAVES = (1, 2, 4, 8, 16, 32)
RHOS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)


@dataclass
class SweepResults:
    rows: list[dict[str, object]] = field(default_factory=list)
    het: list[tuple[float, float]] = field(default_factory=list)  # (h, mean DES speedup)
    waves: list[tuple[int, float, float]] = field(default_factory=list)  # (w, DES, closed form)
    rho_curve: list[tuple[float, float, float, float]] = field(default_factory=list)
    bound_violations: int = 0
    checked: int = 0
    order_violations: int = 0
    tail_bound_violations: int = 0
    balanced_speedup: float = 0.0
    max_speedup: float = 0.0


def _mean_speedup(updates: list[Update], schedule: SimSchedule = SimSchedule.STREAM) -> float:
    return float(
        np.mean(
            [simulate(u, SimSchedule.SYNC).step_s / simulate(u, schedule).step_s for u in updates]
        )
    )


def run(seed: int = 0, samples: int = 12) -> SweepResults:
    rng = np.random.default_rng(seed)
    res = SweepResults()

    # balance with a negligible suffix: uniform release (gamma = 0, beta = 0), many items
    bal = [grpo_update(rng, groups=64, m=8, gamma=0.0, beta=0.0, pi=0.001) for _ in range(samples)]
    res.balanced_speedup = _mean_speedup(bal)
    res.rows.append(
        {
            "trend": "balanced (rho=1, pi=0.001)",
            "x": 1.0,
            "des": res.balanced_speedup,
            "closed": rm.speedup_from_tail(1.0, 0.0, 0.001),
        }
    )

    for h in HETEROGENEITY:  # GRPO speedup vs trajectory-duration dispersion
        s = _mean_speedup([grpo_update(rng, h=h) for _ in range(samples)])
        res.het.append((h, s))
        closed = rm.speedup_from_tail(1.0, rm.tail_of(rm.grpo_release(0.1, 1.0, 8), 1.0), 0.02)
        res.rows.append(
            {"trend": "grpo dispersion h", "x": h, "des": s, "closed": closed if h == 1.0 else None}
        )

    F = rm.grpo_release(0.1, 1.0, 8)
    for w in WAVES:
        s = _mean_speedup([grpo_update(rng, groups=64, waves=w, pi=0.001) for _ in range(4)])
        closed = rm.speedup_from_tail(1.0, rm.tail_of(rm.waved(F, w), 1.0), 0.001)
        res.waves.append((w, s, closed))
        res.rows.append({"trend": "waves w", "x": float(w), "des": s, "closed": closed})

    Fo = rm.opd_release(4, 0.1, 1.0)
    for rho in RHOS:  # GRPO vs OPD at equal rho
        g = _mean_speedup([grpo_update(rng, rho=rho) for _ in range(samples // 2)])
        o = _mean_speedup([opd_update(rng, rho=rho) for _ in range(samples // 2)])
        res.rho_curve.append((rho, g, o, rm.bound(rho, 0.02)))
        res.rows.append(
            {
                "trend": "grpo rho",
                "x": rho,
                "des": g,
                "closed": rm.speedup_from_tail(rho, rm.tail_of(F, rho), 0.02),
            }
        )
        res.rows.append(
            {
                "trend": "opd rho",
                "x": rho,
                "des": o,
                "closed": rm.speedup_from_tail(rho, rm.tail_of(Fo, rho), 0.02),
            }
        )

    # random configurations: bound, schedule order, tail bounds
    for _ in range(200):
        kw: dict[str, Any] = dict(
            h=float(rng.uniform(0.05, 1.0)),
            gamma=float(rng.uniform(0, 2)),
            rho=float(rng.uniform(0.1, 3.0)),
            pi=float(rng.uniform(0, 0.5)),
            ranks=int(rng.integers(1, 5)),
        )
        u = (
            grpo_update(
                rng,
                beta=float(rng.uniform(0, 1)),
                m=int(rng.integers(2, 9)),
                groups=int(rng.integers(1, 9)),
                **kw,
            )
            if rng.random() < 0.5
            else opd_update(
                rng,
                a=int(rng.integers(1, 7)),
                delta=float(rng.uniform(0, 1)),
                trajectories=int(rng.integers(1, 33)),
                **kw,
            )
        )
        t = {
            s: simulate(u, s).step_s
            for s in (SimSchedule.SYNC, SimSchedule.GROUP, SimSchedule.STREAM)
        }
        s = t[SimSchedule.SYNC] / t[SimSchedule.STREAM]
        b = speedup_bound(u.rollout_close, u.learner_busy, u.suffix)
        res.checked += 1
        res.max_speedup = max(res.max_speedup, s)
        res.bound_violations += int(s > b * (1 + 1e-9) or b > 2 + 1e-12)
        res.order_violations += int(
            not (t[SimSchedule.STREAM] <= t[SimSchedule.GROUP] + 1e-9 <= t[SimSchedule.SYNC] + 2e-9)
        )
        if u.ranks == 1:
            R, L = u.rollout_close, u.learner_busy
            uu, Fm = rm.empirical_release(
                [i.ready for i in u.items], [i.service for i in u.items], R
            )
            lam = rm.tail(Fm, uu, L / R)
            lo, hi = rm.tail_bounds(L / R, rm.release_lag(Fm, uu))
            res.tail_bound_violations += int(not lo - 1e-9 <= lam <= hi + 1e-9)
    res.max_speedup = max(
        [res.max_speedup, res.balanced_speedup]
        + [s for _, s in res.het]
        + [s for _, s, _ in res.waves]
    )
    return res


def summary(res: SweepResults) -> dict[str, object]:
    het = [s for _, s in res.het]
    waves = [s for _, s, _ in res.waves]
    return {
        "max_speedup": res.max_speedup,
        "balanced_speedup": res.balanced_speedup,
        "grpo_heterogeneity_rises": all(b >= a - 0.01 for a, b in zip(het, het[1:], strict=False))
        and het[-1] > het[0],
        "grpo_speedup_low_het": het[0],
        "grpo_speedup_high_het": het[-1],
        "waves_approach_2": all(b >= a - 0.01 for a, b in zip(waves, waves[1:], strict=False))
        and waves[-1] >= 1.9,
        "waves_speedup": {str(w): s for w, s, _ in res.waves},
        "bound_violations": res.bound_violations,
        "schedule_order_violations": res.order_violations,
        "tail_bound_violations": res.tail_bound_violations,
        "configs_checked": res.checked,
        "opd_ge_grpo": all(o >= g - 1e-9 for _, g, o, _ in res.rho_curve),
    }
