"""Per-schedule numbers of `tsrl bench speedup`, from run directories (metrics.jsonl, spans.jsonl).

R, L and P are reported for each schedule, not only sync's: overlap can slow both sides (two
busy processes on two cores share caches and memory bandwidth), and the bound taken from sync's
phases then overstates what stream can reach. The learner's time is broken down by work-item
kind (`ids.kind` of its spans) plus the barrier, and `suffix_s` is the learner work left after
the rollout closed (what streaming cannot hide).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from typing import Any

from thundersync.rundir import RunFiles


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def spread(xs: list[float]) -> dict[str, float]:
    """Median, min and max (the rounds' spread, not a confidence interval)."""
    if not xs:
        return {"median": 0.0, "min": 0.0, "max": 0.0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def bound(R: float, L: float, P: float) -> float:
    """The overlap bound (R + L + P) / (max(R, L) + P): sync does R, then L, then P; perfect
    streaming hides the shorter of R and L under the longer."""
    return (R + L + P) / (max(R, L) + P) if max(R, L) + P > 0 else 1.0


def _spans(run: RunFiles) -> list[dict[str, Any]]:
    if not run.spans.exists():
        return []
    return [json.loads(x) for x in run.spans.read_text().splitlines() if x.strip()]


def update_phases(run: RunFiles, skip: int = 1) -> list[dict[str, float]]:
    """Per measured update: learner seconds by work-item kind, `barrier`, and `suffix_s`."""
    metrics = {m["update"]: m for m in run.read_metrics() if m["update"] >= skip}
    phases: dict[int, dict[str, float]] = {u: defaultdict(float) for u in metrics}
    for s in _spans(run):
        u = s.get("update")
        if u not in phases or s.get("role") not in ("learner", "barrier"):
            continue
        dur = s["end"] - s["start"]
        if s["kind"] == "barrier":
            if s.get("role") == "barrier":
                phases[u]["barrier"] += dur
            continue
        kind = s.get("ids", {}).get("kind", s["kind"])
        phases[u][kind] += dur
        m = metrics[u]
        rollout_end = m["time"] - m["step_s"] + m["rollout_s"]
        phases[u]["suffix_s"] += max(0.0, s["end"] - max(s["start"], rollout_end))
    return [dict(phases[u]) for u in sorted(phases)]


def schedule_summary(runs: list[RunFiles], skip: int = 1) -> dict[str, Any]:
    """Medians over every measured update of every round's run of one schedule."""
    recs = [m for r in runs for m in r.read_metrics() if m["update"] >= skip]
    R, L, P = (median([m[k] for m in recs]) for k in ("rollout_s", "learner_busy_s", "barrier_s"))
    phases = [p for r in runs for p in update_phases(r, skip)]
    kinds = sorted({k for p in phases for k in p})
    return {
        "R": R,
        "L": L,
        "P": P,
        "bound": bound(R, L, P),
        "step_s": spread([m["step_s"] for m in recs]),
        "idle_share": median([m["idle_share"] for m in recs]),
        "learner_phases_s": {k: median([p.get(k, 0.0) for p in phases]) for k in kinds},
        "updates": len(recs),
    }
