"""Per-run summaries for the dashboard's runs list and comparison view, in a few queries for a
page of runs (not one query per run and metric)."""

from __future__ import annotations

import statistics
import uuid
from collections import defaultdict
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from thundersync.service.crud import mean_step_s, sync_baseline
from thundersync.service.schemas_dashboard import RunSummary
from thundersync.service.tables import Run, UpdateRow

# OPD's own target metric: the mean token KL to the teacher (metrics.jsonl's `kl_mean`, kept in
# an update's extra fields; lower is better, as in crud.time_to_target); a run without it falls
# back to reward_mean.
OPD_METRICS = ("kl_mean",)


def target_metric(objective: str, extra: dict[str, Any]) -> str | None:
    if objective == "opd":
        for key in OPD_METRICS:
            if isinstance(extra.get(key), int | float):
                return key
    return None


def summarise(*, session: Session, owner_id: uuid.UUID, ids: list[uuid.UUID]) -> list[RunSummary]:
    """Summaries of the owner's runs among `ids`, in the order given (unknown ids are left out)."""
    runs = {
        r.id: r
        for r in session.scalars(select(Run).where(Run.owner_id == owner_id, Run.id.in_(ids)))
    }
    steps: dict[uuid.UUID, list[float]] = defaultdict(list)
    last: dict[uuid.UUID, tuple[int, float]] = {}
    rows = session.execute(
        select(UpdateRow.run_id, UpdateRow.update, UpdateRow.step_s, UpdateRow.reward_mean).where(
            UpdateRow.run_id.in_(list(runs))
        )
    )
    for run_id, update, step_s, reward in rows:
        steps[run_id].append(step_s)
        if run_id not in last or update > last[run_id][0]:
            last[run_id] = (update, reward)
    baselines: dict[tuple[str | None, str], tuple[uuid.UUID, float | None] | None] = {}
    out = []
    for run_id in dict.fromkeys(ids):
        run = runs.get(run_id)
        if run is None:
            continue
        metric, value = "reward_mean", last[run_id][1] if run_id in last else None
        if run_id in last and run.objective == "opd":
            extra = session.scalar(
                select(UpdateRow.extra).where(
                    UpdateRow.run_id == run_id, UpdateRow.update == last[run_id][0]
                )
            )
            key = target_metric(run.objective, extra or {})
            if key is not None and extra is not None:
                metric, value = key, float(extra[key])
        base_key = (run.recipe, run.name if run.recipe is None else "")
        if run.schedule != "sync" and base_key not in baselines:
            base = sync_baseline(session=session, run=run)
            baselines[base_key] = (
                None if base is None else (base.id, mean_step_s(session=session, run_id=base.id))
            )
        base_of = baselines.get(base_key) if run.schedule != "sync" else None
        mine = steps.get(run_id)
        mean = statistics.fmean(mine) if mine else None
        speedup = base_of[1] / mean if base_of and base_of[1] is not None and mean else None
        out.append(
            RunSummary(
                run_id=run_id,
                updates=len(mine or ()),
                metric=metric,
                value=value,
                reward=last[run_id][1] if run_id in last else None,
                step_s_median=statistics.median(mine) if mine else None,
                baseline_id=base_of[0] if base_of else None,
                speedup=speedup,
            )
        )
    return out
