"""Incremental, exactly-once ingestion of the driver's JSONL files.

Only complete lines (ending in a newline) are consumed; the byte offset is stored on the run in the
same transaction as the rows, so a crash or restart neither loses nor duplicates a line. Updates are
additionally unique per (run, update index).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from thundersync.rundir import RunFiles, RunStatus
from thundersync.service.run_state import transition
from thundersync.service.tables import Run, SpanRow, UpdateRow

log = logging.getLogger("tsrl.service.ingest")

MAX_READ_BYTES = 4 << 20
SPAN_ROLES = ("rollout", "tool", "teacher", "learner", "barrier")
UPDATE_FIELDS = (
    "step_s",
    "rollout_s",
    "learner_busy_s",
    "barrier_s",
    "idle_share",
    "mfu",
    "reward_mean",
)
# metrics.jsonl keys before the times carried their unit: a run directory a driver of that time
# wrote (still running across a service upgrade, or re-ingested) reads into the new columns
LEGACY_KEYS = {"R": "rollout_s", "L": "learner_busy_s", "P": "barrier_s"}


def read_complete_lines(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """JSON objects on complete lines after `offset`, and the offset after the last one read."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read(MAX_READ_BYTES)
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    records: list[dict[str, Any]] = []
    for raw in data[: end + 1].splitlines():
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except ValueError:
            log.warning("%s: skipped a line that is not JSON: %r", path, raw[:200])
            continue
        if isinstance(rec, dict):
            records.append(rec)
    return records, offset + end + 1


def _num(rec: dict[str, Any], key: str, default: float = 0.0) -> float:
    value = rec.get(key, default)
    try:
        out = float(value)
    except (TypeError, ValueError):
        return default
    return out if out == out and abs(out) != float("inf") else default


def _jsonable(value: Any) -> Any:
    """Plain JSON for the database: non-finite floats become null (PostgreSQL rejects NaN)."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def _update_row(run: Run, rec: dict[str, Any]) -> UpdateRow | None:
    if rec.get("type", "update") != "update" or not isinstance(rec.get("update"), int):
        return None
    rec = {LEGACY_KEYS.get(k, k): v for k, v in rec.items()}
    known = {"type", "update", "schedule", "time", "tokens", *UPDATE_FIELDS}
    extra = {k: v for k, v in rec.items() if k not in known}
    return UpdateRow(
        run_id=run.id,
        update=rec["update"],
        schedule=str(rec.get("schedule", run.schedule))[:20],
        time=_num(rec, "time"),
        tokens=int(_num(rec, "tokens")),
        extra=_jsonable(extra),
        **{k: _num(rec, k) for k in UPDATE_FIELDS},
    )


def _span_row(run: Run, rec: dict[str, Any]) -> SpanRow | None:
    if rec.get("type", "span") != "span" or rec.get("role") not in SPAN_ROLES:
        return None
    if "start" not in rec or "end" not in rec:
        return None
    ids = rec.get("ids") if isinstance(rec.get("ids"), dict) else {}
    return SpanRow(
        run_id=run.id,
        update=int(_num(rec, "update")),
        role=rec["role"],
        kind=str(rec.get("kind", ""))[:100],
        start=_num(rec, "start"),
        end=_num(rec, "end"),
        ready=_num(rec, "ready") if rec.get("ready") is not None else None,
        ids=_jsonable(ids),
    )


def ingest_run(session: Session, run: Run) -> bool:
    """Ingest what is new in the run directory; True when anything was read."""
    files = RunFiles(run.run_dir)
    progressed = False
    while True:
        records, new_offset = read_complete_lines(files.metrics, run.metrics_offset)
        if new_offset == run.metrics_offset:
            break
        seen = set(
            session.scalars(select(UpdateRow.update).where(UpdateRow.run_id == run.id)).all()
        )
        for rec in records:
            row = _update_row(run, rec)
            if row is not None and row.update not in seen:
                session.add(row)
                seen.add(row.update)
        run.metrics_offset = new_offset
        progressed = True
    while True:
        records, new_offset = read_complete_lines(files.spans, run.spans_offset)
        if new_offset == run.spans_offset:
            break
        rows = [r for r in (_span_row(run, rec) for rec in records) if r is not None]
        session.add_all(rows)
        run.spans_offset = new_offset
        progressed = True
    if progressed:
        session.flush()
        run.updates_done = (
            session.scalar(
                select(func.count()).select_from(UpdateRow).where(UpdateRow.run_id == run.id)
            )
            or 0
        )
    follow_stage(session, run, files)
    return progressed


def follow_stage(session: Session, run: Run, files: RunFiles) -> None:
    """A starting or running run's reason is the driver's current stage (DIR/stage.json), so the
    API and the dashboard say what a run does while it has no update yet (a model download)."""
    line = files.read_stage()
    if not line or run.reason == line or run.cancel_requested_at is not None:
        return
    live = (RunStatus.STARTING, RunStatus.RUNNING)
    if run.status in live:
        transition(session, run.id, expect=live, reason=line[:500])
