"""Balance the speedup bench's workload on the machine it runs on.

Why: the learner's speed relative to the rollout side differs about 2x between VMs of the same
type (the same GRPO workload measured sync L 6.8 s against R 9.4 s on one, L 12.5 s against
R 11.1 s on another), so a workload tuned on one machine gives a bound of 1.70 on the next and
the bench then measures an unbalanced pipeline. Before measuring, two or three sync probes
find the model width at which the learner's phase L equals the rollout's R on this machine: L
grows with the width about quadratically, R less at small widths (a decode step is then mostly
per-layer overhead and the tool call's wait; once the weights no longer fit the caches a batch-1
decode step grows with width^2 too, and the slope of L/R falls from ~2 toward ~0.8), so log(L/R)
is close to linear in log(width) over a probe's step and secant steps land close.
Each probe is the bench's own sync run at that width (the same groups and updates) under the
bench's background load. Probes with half the groups overestimated the bench's L/R by 3-11%
in three runs out of three (0.99 -> 0.88, 0.95 -> 0.92, 0.96 -> 0.87): an update's first
sources and its last one cost the learner more than the rest (~1 s of ~18 s at half the groups),
a per-update cost whose share half the groups doubles; the rest is the machine's noise. Full
probes cost more (a sync run each); a biased one wastes the bench.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

WIDTH_STEP = 32  # 4 query heads with an even head size (RoPE): 32 keeps the workloads' own widths
MIN_WIDTH, MAX_WIDTH = 256, 4096
TOLERANCE = 1.05  # L/R this close to 1 is within one probe's noise


def round_width(h: float) -> int:
    return int(min(MAX_WIDTH, max(MIN_WIDTH, WIDTH_STEP * round(h / WIDTH_STEP))))


def first_guess(h0: int, ratio0: float) -> int:
    """The second probe's width: L proportional to width^2 at a fixed R (halved or doubled at
    most, so one noisy probe cannot send the next one far off)."""
    return round_width(min(2.0 * h0, max(0.5 * h0, h0 / math.sqrt(ratio0))))


def secant_width(points: list[tuple[int, float]]) -> int:
    """The width where L/R = 1, from the last two (width, L/R) probes, in log-log coordinates.

    A slope below 0.5 (L barely moving with the width: noise, or the rollout side growing as
    fast) is not trusted to extrapolate: the closer probe's width is kept.
    """
    (h0, r0), (h1, r1) = points[-2], points[-1]
    closest = min(points, key=lambda p: abs(math.log(p[1])))[0]
    if h0 == h1:
        return closest
    slope = math.log(r1 / r0) / math.log(h1 / h0)
    if slope < 0.5:
        return closest
    return round_width(h1 * math.exp(-math.log(r1) / slope))


Probe = Callable[[int], dict[str, float]]


def balance_width(h0: int, probe: Probe, max_probes: int = 3) -> dict[str, Any]:
    """Probe the workload's width, then the quadratic guess, then secant steps while the last
    probe is more than `TOLERANCE` off balance (at most `max_probes` probes). The width stays
    within [h0 / 2, 2 h0]: a step's cost grows with its square, and so would the bench's."""
    probes: list[dict[str, Any]] = []
    points: list[tuple[int, float]] = []
    h = h0
    while True:
        m = probe(h)
        probes.append({"width": h, **m, "L_over_R": m["L"] / m["R"]})
        points.append((h, m["L"] / m["R"]))
        nxt = first_guess(h0, points[0][1]) if len(points) == 1 else secant_width(points)
        nxt = round_width(min(2.0 * h0, max(0.5 * h0, nxt)))  # bounds the bench's own run time
        if abs(math.log(points[-1][1])) <= math.log(TOLERANCE):  # within the probes' noise
            return {"width": h if len(points) == 1 else nxt, "probes": probes}
        if nxt in (p[0] for p in points) or len(points) == max_probes:
            return {"width": nxt, "probes": probes}
        h = nxt


def sync_probe(
    objective: str, overrides: dict[str, Any], load: float, updates: int, root: Path
) -> Probe:
    """A probe: one sync run of the bench's `updates` at the given width; R, L, P summed over the
    updates the bench measures (1 on). The same updates, not just one: the prompts and what the
    policy generates change from update to update, and L/R with them (one update's L/R was 6%
    off the bench's own median at the same width)."""
    from thundersync.bench.load import BackgroundLoad
    from thundersync.bench.speedup_workloads import workload_config
    from thundersync.driver.run import RunDriver
    from thundersync.rundir import RunFiles

    def run(width: int) -> dict[str, float]:
        over = overrides | {"model.tiny_hidden": width}
        rd = RunFiles(root / f"w{width}")
        with BackgroundLoad(load):
            RunDriver(workload_config(objective, "sync", updates, **over), rd.root).run()
        ms = rd.read_metrics()[1:]
        keys = {"R": "rollout_s", "L": "learner_busy_s", "P": "barrier_s"}  # metrics.jsonl's
        return {k: sum(float(m[key]) for m in ms) for k, key in keys.items()}

    return run
