"""Per-update metrics of a run (DIR/metrics.jsonl as ingested by the launcher)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from thundersync.service import crud
from thundersync.service.api.deps import Limit, OwnedRun, SessionDep, Skip
from thundersync.service.schemas import UpdatePublic, UpdatesPublic

router = APIRouter(prefix="/runs", tags=["updates"])


@router.get("/{run_id}/updates", response_model=UpdatesPublic)
def list_updates(
    session: SessionDep,
    run: OwnedRun,
    skip: Skip = 0,
    limit: Limit = 1000,
    after: Annotated[
        int | None, Query(ge=-1, le=2**31 - 1, description="only updates with a larger index")
    ] = None,
) -> UpdatesPublic:
    rows, count = crud.list_updates(
        session=session, run_id=run.id, skip=skip, limit=limit, after=after
    )
    return UpdatesPublic(data=[UpdatePublic.model_validate(r) for r in rows], count=count)
