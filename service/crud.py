"""Database operations, keyword-only, each scoped to the owning token where rows have an owner.
Token operations live in service/crud_tokens.py, task sets and models in service/crud_artifacts.py;
both are re-exported here.

Routes call these and never build queries themselves; the launcher has its own writes in
service/launcher/ (it is the only writer of run state after `queued`).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from thundersync.config import RunConfig
from thundersync.reward_curve import curve
from thundersync.rundir import ACTIVE_STATUSES, RunFiles, RunStatus
from thundersync.service.crud_artifacts import (
    count_local_tasks,
    create_model,
    create_task_set,
    delete_model,
    delete_task_set,
    get_model,
    get_model_by_name,
    get_task_set,
    get_task_set_by_name,
    list_models,
    list_task_sets,
    recount_uploaded_tasks,
    task_set_origin,
    update_task_set,
)
from thundersync.service.crud_tokens import (
    CONFIGURED_ADMIN,
    create_token,
    ensure_admin_token,
    get_token,
    get_token_by_secret,
    list_tokens,
    revoke_token,
)
from thundersync.service.db import utcnow
from thundersync.service.run_state import transition
from thundersync.service.schemas import CurvePoint, RunDetail, RunPublic, Speedup, TimeToTarget
from thundersync.service.tables import Run, SpanRow, Token, UpdateRow

__all__ = [
    "CONFIGURED_ADMIN",
    "count_local_tasks",
    "create_model",
    "create_task_set",
    "delete_model",
    "delete_task_set",
    "get_model",
    "get_model_by_name",
    "get_task_set",
    "get_task_set_by_name",
    "list_models",
    "list_task_sets",
    "recount_uploaded_tasks",
    "task_set_origin",
    "update_task_set",
    "create_token",
    "ensure_admin_token",
    "get_token",
    "get_token_by_secret",
    "list_tokens",
    "revoke_token",
]

# --- runs ---------------------------------------------------------------------------------------


def run_public(run: Run, *, detail: bool = False) -> RunPublic:
    fields: dict[str, Any] = {
        "id": run.id,
        "name": run.name,
        "recipe": run.recipe,
        "objective": run.objective,
        "schedule": run.schedule,
        "status": run.status,
        "reason": run.reason,
        "backend": run.backend,
        "updates_total": int(run.config.get("updates", 0)),
        "updates_done": run.updates_done,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "cancel_requested": run.cancel_requested_at is not None,
    }
    if detail:
        return RunDetail(config=run.config, **fields)
    return RunPublic(**fields)


def create_run(
    *,
    session: Session,
    owner: Token,
    config: RunConfig,
    recipe: str | None,
    name: str | None,
    runs_dir: Path,
    backend: str,
) -> Run:
    run_id = uuid.uuid4()
    run_dir = runs_dir / str(run_id)
    resolved = config.model_copy(update={"output_dir": str(run_dir / "output")})
    run = Run(
        id=run_id,
        owner_id=owner.id,
        name=name or config.name,
        recipe=recipe,
        objective=str(config.objective.value),
        schedule=str(config.schedule.value),
        config=resolved.model_dump(mode="json"),
        status=RunStatus.QUEUED,
        reason="waiting for a launcher slot",
        backend=backend,
        run_dir=str(run_dir),
    )
    session.add(run)
    session.flush()
    return run


def run_quota(*, token: Token, default: int) -> int:
    """Runs the token may have queued or running at once; 0: no limit."""
    return token.max_active_runs if token.max_active_runs is not None else default


def lock_token(*, session: Session, token: Token) -> None:
    """Hold the token's row until commit (SELECT ... FOR UPDATE; nothing on SQLite, whose
    writers are serialised anyway), so two submissions of one token are checked one at a time."""
    session.execute(select(Token.id).where(Token.id == token.id).with_for_update())


def count_active_runs(*, session: Session, owner_id: uuid.UUID) -> int:
    query = select(func.count()).where(Run.owner_id == owner_id, Run.status.in_(ACTIVE_STATUSES))
    return session.scalar(query) or 0


def list_runs(
    *,
    session: Session,
    owner_id: uuid.UUID,
    skip: int,
    limit: int,
    status: RunStatus | None = None,
    recipe: str | None = None,
    schedule: str | None = None,
    name: str | None = None,
) -> tuple[list[Run], int]:
    query = select(Run).where(Run.owner_id == owner_id)
    if status is not None:
        query = query.where(Run.status == status)
    if recipe is not None:
        query = query.where(Run.recipe == recipe)
    if schedule is not None:
        query = query.where(Run.schedule == schedule)
    if name is not None:
        query = query.where(Run.name.contains(name, autoescape=True))
    count = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Run.created_at.desc(), Run.id).offset(skip).limit(limit))
    return list(rows), count


def get_run(*, session: Session, owner_id: uuid.UUID, run_id: uuid.UUID) -> Run | None:
    run = session.get(Run, run_id)
    if run is None or run.owner_id != owner_id:
        return None
    return run


def request_cancel(*, session: Session, run: Run) -> Run:
    """Queued runs stop at once; started ones get DIR/CANCEL and stop at the next barrier."""
    now = utcnow()
    done = transition(
        session,
        run.id,
        expect=(RunStatus.QUEUED,),
        to=RunStatus.CANCELLED,
        reason="cancelled before it started",
        finished_at=now,
        cancel_requested_at=now,
    )
    session.refresh(run)  # a failed claim means the launcher (or a cancel) changed it: re-read
    if not done and run.status in ACTIVE_STATUSES and run.cancel_requested_at is None:
        transition(session, run.id, expect=ACTIVE_STATUSES, cancel_requested_at=now)
        RunFiles(run.run_dir).request_cancel()  # else `_supervise` forwards it on its next tick
    session.refresh(run)
    return run


def delete_run(*, session: Session, run: Run) -> None:
    run_dir = Path(run.run_dir)
    session.delete(run)
    session.flush()
    if run.run_dir and run_dir.is_dir():
        shutil.rmtree(run_dir, ignore_errors=True)


def list_updates(
    *, session: Session, run_id: uuid.UUID, skip: int, limit: int, after: int | None = None
) -> tuple[list[UpdateRow], int]:
    query = select(UpdateRow).where(UpdateRow.run_id == run_id)
    if after is not None:
        query = query.where(UpdateRow.update > after)
    count = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(UpdateRow.update).offset(skip).limit(limit))
    return list(rows), count


def list_spans(
    *,
    session: Session,
    run_id: uuid.UUID,
    start: float | None,
    end: float | None,
    role: str | None,
    update: int | None,
    after_id: int | None,
    limit: int,
) -> tuple[list[SpanRow], int]:
    query = select(SpanRow).where(SpanRow.run_id == run_id)
    if start is not None:
        query = query.where(SpanRow.end >= start)
    if end is not None:
        query = query.where(SpanRow.start <= end)
    if role is not None:
        query = query.where(SpanRow.role == role)
    if update is not None:
        query = query.where(SpanRow.update == update)
    if after_id is not None:
        query = query.where(SpanRow.id > after_id)
    count = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(SpanRow.id).limit(limit))
    return list(rows), count


def timeline_origin(*, session: Session, run_id: uuid.UUID) -> float | None:
    return session.scalar(select(func.min(SpanRow.start)).where(SpanRow.run_id == run_id))


def mean_step_s(*, session: Session, run_id: uuid.UUID) -> float | None:
    value = session.scalar(select(func.avg(UpdateRow.step_s)).where(UpdateRow.run_id == run_id))
    return float(value) if value is not None else None


def sync_baseline(*, session: Session, run: Run) -> Run | None:
    """The latest sync run of the same recipe (same owner) with updates; None for a sync run."""
    if run.schedule == "sync":
        return None
    same = Run.recipe == run.recipe if run.recipe is not None else Run.name == run.name
    return session.scalar(
        select(Run)
        .where(Run.owner_id == run.owner_id, Run.schedule == "sync", same, Run.updates_done > 0)
        .order_by(Run.created_at.desc())
        .limit(1)
    )


def speedup(*, session: Session, run: Run) -> Speedup:
    """Mean step time of the latest sync run of the same recipe (same owner) over this run's."""
    baseline = sync_baseline(session=session, run=run)
    step = mean_step_s(session=session, run_id=run.id)
    base = mean_step_s(session=session, run_id=baseline.id) if baseline is not None else None
    ratio = base / step if base is not None and step else None
    return Speedup(
        run_id=run.id,
        baseline_id=baseline.id if baseline is not None else None,
        step_s=step,
        baseline_step_s=base,
        speedup=ratio,
    )


def target_curve(rows: list[UpdateRow], metric: str) -> list[CurvePoint]:
    """`metric` per update against wall time (updates without it are left out)."""
    values = {
        r.update: r.reward_mean if metric == "reward_mean" else r.extra.get(metric) for r in rows
    }
    pts = curve(
        {"update": r.update, "time": r.time, "step_s": r.step_s, "reward_mean": r.reward_mean}
        for r in rows
    )
    return [
        CurvePoint(update=p.update, t=p.t, reward=p.reward, value=float(v))
        for p in pts
        if isinstance(v := values[p.update], int | float) and not isinstance(v, bool)
    ]


def time_to_target(*, session: Session, run: Run, target: float) -> TimeToTarget:
    """Wall time to `target` for this run and its sync baseline (as `speedup`), on the
    objective's own metric: mean reward (reached at >= target), or for OPD the mean token KL to
    the teacher (reached at <= target; an OPD run whose updates carry no KL: reward)."""
    baseline = sync_baseline(session=session, run=run)
    rows_of = lambda i: list(session.scalars(select(UpdateRow).where(UpdateRow.run_id == i)))  # noqa: E731
    rows = rows_of(run.id)
    has_kl = not rows or any(isinstance(r.extra.get("kl_mean"), int | float) for r in rows)
    lower = run.objective == "opd" and has_kl
    metric = "kl_mean" if lower else "reward_mean"
    mine = target_curve(rows, metric)
    base = target_curve(rows_of(baseline.id), metric) if baseline is not None else []

    def reached(c: list[CurvePoint]) -> float | None:
        return next((p.t for p in c if (p.value <= target if lower else p.value >= target)), None)

    t, tb = reached(mine), reached(base)
    return TimeToTarget(
        run_id=run.id,
        baseline_id=baseline.id if baseline is not None else None,
        target=target,
        metric="kl_mean" if lower else "reward_mean",
        lower_is_better=lower,
        curve=mine,
        baseline_curve=base,
        time_to_target_s=t,
        baseline_time_to_target_s=tb,
        ratio=tb / t if t and tb is not None else None,
    )
