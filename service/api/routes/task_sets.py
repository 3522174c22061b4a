"""Task sets: named collections of SWE-smith instances, SETA / Terminal-Bench / Harbor tasks or
skyrl-gym data that run configs refer to by name (`env.tasks`)."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from service import crud
from service.api.deps import CurrentToken, Limit, SessionDep, Skip
from service.models import TaskSet
from service.schemas import (
    ErrorDetail,
    Message,
    TaskSetCreate,
    TaskSetKind,
    TaskSetPublic,
    TaskSetsPublic,
    TaskSetUpdate,
)

router = APIRouter(prefix="/task-sets", tags=["task-sets"])


def _owned(session: SessionDep, token: CurrentToken, task_set_id: uuid.UUID) -> TaskSet:
    row = crud.get_task_set(session=session, owner_id=token.id, task_set_id=task_set_id)
    if row is None:
        raise HTTPException(status_code=404, detail=f"task set {task_set_id} not found")
    return row


@router.post(
    "",
    response_model=TaskSetPublic,
    status_code=status.HTTP_201_CREATED,
    responses={409: {"model": ErrorDetail}},
)
def create_task_set(
    session: SessionDep, token: CurrentToken, task_set_in: TaskSetCreate
) -> TaskSetPublic:
    """Register a task collection; a local .jsonl file or folder of tasks is counted."""
    if crud.get_task_set_by_name(session=session, owner_id=token.id, name=task_set_in.name):
        raise HTTPException(
            status_code=status.HTTP_409_CONFLICT,
            detail=f"task set {task_set_in.name!r} exists: pick another name or delete it first",
        )
    row = crud.create_task_set(session=session, owner=token, task_set_in=task_set_in)
    session.commit()
    return TaskSetPublic.model_validate(row)


@router.get("", response_model=TaskSetsPublic)
def list_task_sets(
    session: SessionDep,
    token: CurrentToken,
    skip: Skip = 0,
    limit: Limit = 100,
    kind: Annotated[TaskSetKind | None, Query()] = None,
) -> TaskSetsPublic:
    rows, count = crud.list_task_sets(
        session=session,
        owner_id=token.id,
        skip=skip,
        limit=limit,
        kind=kind.value if kind is not None else None,
    )
    return TaskSetsPublic(data=[TaskSetPublic.model_validate(r) for r in rows], count=count)


@router.get("/{task_set_id}", response_model=TaskSetPublic)
def read_task_set(
    session: SessionDep, token: CurrentToken, task_set_id: uuid.UUID
) -> TaskSetPublic:
    return TaskSetPublic.model_validate(_owned(session, token, task_set_id))


@router.patch("/{task_set_id}", response_model=TaskSetPublic)
def update_task_set(
    session: SessionDep, token: CurrentToken, task_set_id: uuid.UUID, task_set_in: TaskSetUpdate
) -> TaskSetPublic:
    row = crud.update_task_set(
        session=session, task_set=_owned(session, token, task_set_id), task_set_in=task_set_in
    )
    session.commit()
    return TaskSetPublic.model_validate(row)


@router.delete("/{task_set_id}", response_model=Message)
def delete_task_set(session: SessionDep, token: CurrentToken, task_set_id: uuid.UUID) -> Message:
    crud.delete_task_set(session=session, task_set=_owned(session, token, task_set_id))
    session.commit()
    return Message(message=f"task set {task_set_id} deleted")
