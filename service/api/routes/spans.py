"""Timeline spans of a run in a time window (DIR/spans.jsonl as ingested by the launcher)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from thundersync.service import crud
from thundersync.service.api.deps import Limit, OwnedRun, SessionDep
from thundersync.service.schemas import SpanPublic, SpanRole, SpansPublic

router = APIRouter(prefix="/runs", tags=["spans"])

Seconds = Annotated[
    float | None, Query(ge=0, le=1e11, allow_inf_nan=False, description="unix seconds")
]


@router.get("/{run_id}/spans", response_model=SpansPublic)
def list_spans(
    session: SessionDep,
    run: OwnedRun,
    start: Seconds = None,
    end: Seconds = None,
    role: SpanRole | None = None,
    update: Annotated[int | None, Query(ge=0, le=2**31 - 1)] = None,
    after_id: Annotated[
        int | None, Query(ge=0, le=2**62, description="only spans ingested after this id")
    ] = None,
    limit: Limit = 1000,
) -> SpansPublic:
    """Spans overlapping [start, end] (either may be open), oldest first."""
    rows, count = crud.list_spans(
        session=session,
        run_id=run.id,
        start=start,
        end=end,
        role=role,
        update=update,
        after_id=after_id,
        limit=limit,
    )
    return SpansPublic(
        data=[SpanPublic.model_validate(r) for r in rows],
        count=count,
        t0=crud.timeline_origin(session=session, run_id=run.id),
    )
