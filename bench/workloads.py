"""Sampled workloads for the simulator: GRPO groups and OPD multi-turn trajectories.

They follow the release models of `bench.release_models` (durations uniform on [(1-h) R0, R0], item
service proportional to duration^gamma, a group-gated share beta for GRPO, a deferred share delta for
OPD, w consecutive waves), so the simulator can be checked against the closed forms, and add what the
closed forms leave out: finitely many items, several ranks, duration dispersion h < 1.
Services are scaled so the busiest lane's work is exactly rho * R; the suffix is pi * R.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from thundersync.bench.simulator import Update, WorkItem


@dataclass(frozen=True)
class _Raw:
    ready: float
    weight: float
    close: float
    rank: int
    part: int  # 0: main share, 1: gated / deferred share


def _durations(rng: np.random.Generator, n: int, h: float) -> np.ndarray:
    if not 0.0 < h <= 1.0:
        raise ValueError(f"dispersion h={h} must be in (0, 1]")
    return rng.uniform(1.0 - h, 1.0, size=n)


def _scale(raw: list[_Raw], share: float, rho: float, pi: float, ranks: int) -> Update:
    """Split each part's total to (1-share, share), then scale so the busiest lane does rho * R."""
    R = max(r.ready for r in raw)
    tot = [sum(r.weight for r in raw if r.part == k) for k in (0, 1)]
    frac = (1.0 - share, share)
    w = [r.weight * frac[r.part] / tot[r.part] if tot[r.part] > 0 else 0.0 for r in raw]
    loads = [0.0] * ranks
    for r, x in zip(raw, w, strict=True):
        loads[r.rank] += x
    k = rho * R / max(loads)
    items = tuple(
        WorkItem(ready=r.ready, service=x * k, group_close=r.close, rank=r.rank)
        for r, x in zip(raw, w, strict=True)
        if x > 0
    )
    return Update(items=items, rollout_close=R, suffix=pi * R)


def grpo_update(
    rng: np.random.Generator,
    *,
    groups: int = 16,
    m: int = 8,
    h: float = 1.0,
    gamma: float = 1.0,
    beta: float = 0.1,
    rho: float = 1.0,
    pi: float = 0.02,
    ranks: int = 1,
    waves: int = 1,
) -> Update:
    """groups x m trajectories; per-trajectory work at its reward, group work at group close.

    With waves > 1 the groups are split evenly over w consecutive rollout waves."""
    raw: list[_Raw] = []
    d = _durations(rng, groups * m, h)
    for g in range(groups):
        wave = g * waves // groups
        ready = [(wave + x) / waves for x in d[g * m : (g + 1) * m]]
        close = max(ready)
        for i, t in enumerate(ready):
            dur = d[g * m + i]
            raw.append(_Raw(t, float(dur**gamma), close, (g * m + i) % ranks, 0))
        raw.append(_Raw(close, float(max(d[g * m : (g + 1) * m]) ** gamma), close, g % ranks, 1))
    return _scale(raw, beta, rho, pi, ranks)


def opd_update(
    rng: np.random.Generator,
    *,
    trajectories: int = 64,
    a: int = 4,
    h: float = 1.0,
    gamma: float = 1.0,
    delta: float = 0.1,
    rho: float = 1.0,
    pi: float = 0.02,
    ranks: int = 1,
) -> Update:
    """Turn i of a trajectory of duration t is ready at t i / a; the deferred share at close (t)."""
    raw: list[_Raw] = []
    for j, dur in enumerate(_durations(rng, trajectories, h)):
        wt = float(dur**gamma)
        for i in range(1, a + 1):
            raw.append(_Raw(dur * i / a, wt / a, float(dur), j % ranks, 0))
        raw.append(_Raw(float(dur), wt, float(dur), j % ranks, 1))
    return _scale(raw, delta, rho, pi, ranks)
