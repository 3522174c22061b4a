"""Closed forms of the release model (the paper's App. F, re-derived here; the paper's text was not
available to us, so every step is written out and checked against the simulator in the tests).

Units: time in units of the rollout close R (u = t / R in [0, 1]); rho = L / R (learner work of the
busiest lane over rollout time); pi = P / R (suffix). F(u) is the *released-service fraction*: the
share of the learner's work released by time uR; F^-(u) its left limit (released strictly before).

1. Tail. A FIFO lane that is work-conserving finishes at
     c_n = max_j (tau_j + work released at or after tau_j) = max_u [uR + L (1 - F^-(u))]
   (the last busy period starts at some release time). Its overrun past rollout close, in units of R,
     lambda = (c_n - R)_+ / R = sup_u [u - 1 + rho (1 - F^-(u))]_+.
   At u = 0 the bracket is rho - 1, so lambda >= [rho - 1]_+. With the release lag
   D = sup_u [u - F^-(u)]_+, 1 - F^-(u) <= (1 - u) + D, hence
     u - 1 + rho (1 - F^-(u)) <= (rho - 1)(1 - u) + rho D <= [rho - 1]_+ + rho D, so
     [rho - 1]_+ <= lambda <= [rho - 1]_+ + rho D.
   lambda is rho-Lipschitz in F: sup and [.]_+ are 1-Lipschitz, so |lambda(F) - lambda(G)| <=
   rho sup|F^- - G^-|. Larger F (earlier release) never increases lambda.
2. Speedup. Sync releases everything at R: T_sync = R + L + P. Stream: T = R (1 + lambda) + P, so
     S = (1 + rho + pi) / (1 + lambda + pi) <= (1 + rho + pi) / (max(1, rho) + pi) <= 2,
   using lambda >= [rho - 1]_+ and R + L <= 2 max(R, L). S -> 2 at rho = 1, pi -> 0, D -> 0.
3. GRPO release model. Trajectory durations uniform on [0, R]; a work item's service grows as
   duration^gamma (gamma = 1: linear in tokens). A share 1 - beta of the service is per trajectory,
   released when that trajectory is rewarded: its released fraction is
     int_0^u t^gamma dt / int_0^1 t^gamma dt = u^(gamma+1).
   A share beta is group-gated (statistics, the shared-prompt adjoint) and released when the group
   closes, at Z = max of m uniforms (density m z^(m-1)), weighted by Z^gamma:
     int_0^u z^gamma m z^(m-1) dz / (same to 1) = u^(gamma+m).
   So F(u) = (1 - beta) u^(gamma+1) + beta u^(gamma+m).
   Duration dispersion (`bench.workloads`, durations uniform on [(1-h) R, R]) is simulated: low h puts
   every release near R (large D, S near 1); h = 1 is the closed form above.
4. OPD release model. A trajectory of a turns and duration t releases turn i at t i / a (scored by
   the teacher while the tool runs), each with 1/a of its per-turn service; a share delta (the
   deferred propagation through earlier turns' KV) is released at trajectory close. With the same
   duration model:  F(u) = (1 - delta) (1/a) sum_i min(1, u a / i)^(gamma+1) + delta u^(gamma+1).
   Since min(1, ua/i) >= u, F_OPD >= u^(gamma+1) >= F_GRPO pointwise, so OPD's tail is at most
   GRPO's and its speedup at least GRPO's at equal rho.
5. Waves. If the batch is rolled out in w consecutive waves of length R/w (concurrency below the
   batch size) with the same within-wave release F, then F_w(u) = (floor(wu) + F(frac(wu))) / w,
   D_w = D / w and lambda_w -> [rho - 1]_+: S -> the bound, -> 2 at balance, as w grows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]
ReleaseFn = Callable[[Array], Array]
GRID = np.linspace(0.0, 1.0, 4001)


def grpo_release(beta: float, gamma: float, m: int) -> ReleaseFn:
    def F(u: Array) -> Array:
        u = np.clip(u, 0.0, 1.0)
        return (1 - beta) * u ** (gamma + 1) + beta * u ** (gamma + m)

    return F


def opd_release(a: int, delta: float, gamma: float) -> ReleaseFn:
    def F(u: Array) -> Array:
        u = np.clip(u, 0.0, 1.0)
        turns = sum(np.minimum(1.0, u * a / i) ** (gamma + 1) for i in range(1, a + 1)) / a
        return (1 - delta) * turns + delta * u ** (gamma + 1)

    return F


def waved(F: ReleaseFn, w: int) -> ReleaseFn:
    """Release of w consecutive waves, each releasing like F within its R/w window."""

    def Fw(u: Array) -> Array:
        x = np.clip(u, 0.0, 1.0) * w
        k = np.minimum(np.floor(x), w - 1)
        return (k + F(x - k)) / w

    return Fw


def tail(F_minus: Array, u: Array, rho: float) -> float:
    """lambda = sup_u [u - 1 + rho (1 - F^-(u))]_+ on the given points (include u = 0)."""
    return float(max(0.0, np.max(u - 1.0 + rho * (1.0 - F_minus))))


def release_lag(F_minus: Array, u: Array) -> float:
    """D = sup_u [u - F^-(u)]_+."""
    return float(max(0.0, np.max(u - F_minus)))


def tail_of(F: ReleaseFn, rho: float, grid: Array = GRID) -> float:
    """lambda of a continuous release function (F^- = F) on a fine grid."""
    return tail(F(grid), grid, rho)


def lag_of(F: ReleaseFn, grid: Array = GRID) -> float:
    return release_lag(F(grid), grid)


def tail_bounds(rho: float, D: float) -> tuple[float, float]:
    """[rho - 1]_+ <= lambda <= [rho - 1]_+ + rho D."""
    lo = max(0.0, rho - 1.0)
    return lo, lo + rho * D


def speedup_from_tail(rho: float, lam: float, pi: float) -> float:
    return (1.0 + rho + pi) / (1.0 + lam + pi)


def bound(rho: float, pi: float) -> float:
    """(1 + rho + pi) / (max(1, rho) + pi) = (R + L + P) / (max(R, L) + P)."""
    return (1.0 + rho + pi) / (max(1.0, rho) + pi)


def empirical_release(
    ready: Sequence[float], service: Sequence[float], R: float
) -> tuple[Array, Array]:
    """(u, F^-(u)) at u = 0 and every release time tau_j / R of a finite set of work items.

    With these points `tail` equals the simulator's single-lane overrun exactly (the sup of the
    piecewise-constant bracket is attained at a release time)."""
    r = np.asarray(ready, dtype=np.float64)
    p = np.asarray(service, dtype=np.float64)
    L = float(p.sum())
    t = np.concatenate([[0.0], np.unique(r)])
    before = np.array([p[r < x].sum() for x in t]) / (L if L > 0 else 1.0)
    return t / R, before
