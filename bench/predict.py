"""Predict a stream run's step time from a sync run's trace (`tsrl predict`).

A sync run already records everything the release model needs: each learner work item's objective
ready time (span field "ready"), its service time (span end - start: under sync the item runs
undisturbed after R, so its duration is its service), and R, P per update (metrics.jsonl). Replaying
those items through the simulator with release = ready gives the stream step time the same workload
would take, T = max(R, c_n) + P, and the speedup over the measured sync step.

Run-directory format: docs/CONTRACTS.md. The update's start t0 is `time - step_s` when the metrics
line's `time` is the update's end (it is not before the last span of the update), else `time`
itself. Items carry `ids.group` (group close = latest ready of the group) and optionally `ids.rank`.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from thundersync.bench.simulator import SimSchedule, Update, WorkItem, simulate, speedup_bound
from thundersync.rundir import RunFiles


class TraceError(ValueError):
    """A trace that cannot be read, phrased with the file and the fix."""


@dataclass(frozen=True)
class TraceUpdate:
    update: int
    schedule: str
    step_s: float
    R: float
    L: float
    P: float
    workload: Update


@dataclass(frozen=True)
class Prediction:
    update: int
    sync_step_s: float  # measured
    replayed_sync_s: float  # simulator's sync step from the same items (model consistency)
    stream_step_s: float  # predicted
    speedup: float  # measured sync / predicted stream
    bound: float


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise TraceError(f"{path}:{n}: not JSON ({e}); each line must be one object") from e
    return out


def _paths(trace: Path) -> tuple[Path, Path]:
    files = RunFiles(trace if trace.is_dir() else trace.parent)
    spans = files.spans if trace.is_dir() else trace
    metrics = files.metrics
    if not spans.exists():
        raise TraceError(f"{spans} not found: pass a run directory or its {files.spans.name}")
    if not metrics.exists():
        raise TraceError(
            f"{metrics} not found: R and P per update come from the run's {metrics.name}"
        )
    return spans, metrics


def load_trace(trace: str | Path) -> list[TraceUpdate]:
    """Updates of a run directory (or its spans.jsonl), with their learner work items."""
    spans_path, metrics_path = _paths(Path(trace))
    metrics = {int(m["update"]): m for m in _read_jsonl(metrics_path) if m.get("type") == "update"}
    by_update: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for s in _read_jsonl(spans_path):
        if s.get("type", "span") == "span":
            by_update[int(s["update"])].append(s)
    out = []
    for k in sorted(metrics):
        m = metrics[k]
        spans = by_update.get(k, [])
        last_end = max((float(s["end"]) for s in spans), default=float(m["time"]))
        t0 = float(m["time"]) - float(m["step_s"]) if m["time"] >= last_end - 1e-6 else m["time"]
        work = [s for s in spans if s.get("role") == "learner" and "ready" in s]
        close: dict[str, float] = defaultdict(float)
        for s in work:
            g = str(s.get("ids", {}).get("group", s.get("ids", {}).get("source", id(s))))
            close[g] = max(close[g], float(s["ready"]) - t0)
        items = []
        for s in work:
            ids = s.get("ids", {})
            g = str(ids.get("group", ids.get("source", id(s))))
            items.append(
                WorkItem(
                    ready=float(s["ready"]) - t0,
                    service=float(s["end"]) - float(s["start"]),
                    group_close=close[g],
                    rank=int(ids.get("rank", 0)),
                )
            )
        R, L, P = float(m["rollout_s"]), float(m["learner_busy_s"]), float(m["barrier_s"])
        wl = Update(items=tuple(items), rollout_close=R, suffix=P)
        out.append(TraceUpdate(k, str(m["schedule"]), float(m["step_s"]), R, L, P, wl))
    if not out:
        raise TraceError(f"{metrics_path} has no update lines ({{'type': 'update', ...}})")
    return out


@dataclass(frozen=True)
class Contention:
    """What overlap costs each side, as stream/sync ratios (1.0: none; the release model's own
    assumption). Measured by `tsrl bench speedup` (`contention`) or by `check` below."""

    rollout: float = 1.0  # R: ready times and the rollout close stretch by this
    learner: float = 1.0  # service of items released before the rollout closes

    def apply(self, wl: Update) -> Update:
        if (self.rollout, self.learner) == (1.0, 1.0):
            return wl
        R = wl.rollout_close
        items = tuple(
            WorkItem(
                ready=i.ready * self.rollout,
                service=i.service * (self.learner if i.ready < R else 1.0),
                group_close=i.group_close * self.rollout,
                rank=i.rank,
            )
            for i in wl.items
        )
        return Update(items=items, rollout_close=R * self.rollout, suffix=wl.suffix)


def predict(updates: list[TraceUpdate], contention: Contention | None = None) -> list[Prediction]:
    """Stream step time predicted for each sync update of a trace."""
    contention = contention or Contention()
    sync = [u for u in updates if u.schedule == SimSchedule.SYNC]
    if not sync:
        raise TraceError("the trace has no sync updates: record one with schedule=sync")
    preds = []
    for u in sync:
        if not u.workload.items:
            raise TraceError(f"update {u.update}: no learner spans with a 'ready' field")
        stream = simulate(contention.apply(u.workload), SimSchedule.STREAM).step_s
        preds.append(
            Prediction(
                update=u.update,
                sync_step_s=u.step_s,
                replayed_sync_s=simulate(u.workload, SimSchedule.SYNC).step_s,
                stream_step_s=stream,
                speedup=u.step_s / stream,
                bound=speedup_bound(u.R, u.workload.learner_busy, u.P),
            )
        )
    return preds


def check(
    preds: list[Prediction], measured: list[TraceUpdate], sync: list[TraceUpdate] | None = None
) -> dict[str, float]:
    """Compare predicted stream steps with measured stream updates.

    `rel_error` compares the run's mean step time, predicted against measured: what a user
    predicts (how long will my stream run's steps take). Updates present in both (same index)
    are also paired one by one, `rel_error_per_update` = mean |pred - meas| / meas; that adds
    each single update's own machine noise, which no model of the workload can predict (the
    bench's two sync rounds differ by as much per update: `noise_per_update`). With the sync
    updates, the contention the stream run had is reported too (`contention_rollout`,
    `contention_learner`: stream/sync means of R and L): what the model leaves out, measured."""
    stream = {u.update: u.step_s for u in measured if u.schedule == SimSchedule.STREAM}
    if not stream:
        raise TraceError("no stream updates to check against: record a run with schedule=stream")
    pairs = [(p.stream_step_s, stream[p.update]) for p in preds if p.update in stream]
    pred_mean = statistics.fmean(p.stream_step_s for p in preds)
    meas_mean = statistics.fmean(stream.values())
    out = {
        "predicted_stream_step_s": pred_mean,
        "measured_stream_step_s": meas_mean,
        "rel_error": abs(pred_mean - meas_mean) / meas_mean,
        "paired_updates": float(len(pairs)),
    }
    if pairs:
        out["rel_error_per_update"] = statistics.fmean(abs(a - b) / b for a, b in pairs)
    sync_on = [u for u in sync or [] if u.schedule == SimSchedule.SYNC]
    streams = [u for u in measured if u.schedule == SimSchedule.STREAM]
    if sync_on:
        for key, attr in (("contention_rollout", "R"), ("contention_learner", "L")):
            base = statistics.fmean(getattr(u, attr) for u in sync_on)
            got = statistics.fmean(getattr(u, attr) for u in streams)
            out[key] = got / base if base > 0 else 0.0
    return out


def summary(preds: list[Prediction]) -> dict[str, Any]:
    sync = statistics.fmean(p.sync_step_s for p in preds)
    stream = statistics.fmean(p.stream_step_s for p in preds)
    return {
        "updates": len(preds),
        "sync_step_s": sync,
        "predicted_stream_step_s": stream,
        "predicted_speedup": sync / stream,
        "bound": statistics.fmean(p.bound for p in preds),
        "replay_sync_rel_error": statistics.fmean(
            abs(p.replayed_sync_s - p.sync_step_s) / p.sync_step_s for p in preds
        ),
        "per_update": [asdict(p) for p in preds],
    }
