"""Task sets: named collections of SWE-smith instances, SETA / Terminal-Bench / Harbor tasks or
skyrl-gym data that run configs refer to by name or id (`env.tasks`).

A task set's tasks are uploaded into the service's data dir (no `source`, then
`PUT /task-sets/{id}/files/PATH`), registered as a host path (admins only), or recorded as a
dataset URI. A token sees its own task sets and the shared ones; it changes only its own.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, status

from thundersync.service import crud
from thundersync.service.api.deps import CurrentToken, Limit, SessionDep, SettingsDep, Skip
from thundersync.service.artifacts import task_set_files_dir
from thundersync.service.schemas import ErrorDetail, Message
from thundersync.service.schemas_artifacts import (
    TaskSetCreate,
    TaskSetKind,
    TaskSetPublic,
    TaskSetsPublic,
    TaskSetUpdate,
    UploadedFile,
)
from thundersync.service.tables import ArtifactOrigin, TaskSet, Token
from thundersync.service.uploads import UPLOAD_OPENAPI, UPLOAD_RESPONSES, save_upload

router = APIRouter(prefix="/task-sets", tags=["task-sets"])


def _get(session: SessionDep, token: Token, task_set_id: uuid.UUID, own: bool) -> TaskSet:
    row = crud.get_task_set(session=session, token=token, task_set_id=task_set_id, own=own)
    if row is None:
        raise HTTPException(status_code=404, detail=f"task set {task_set_id} not found")
    return row


def check_admin_fields(
    token: Token, *, host_path: str | None, host_field: str, shared: bool
) -> None:
    """403 naming the field: only admins register host paths and share artifacts."""
    if host_path is not None and not token.is_admin:
        raise HTTPException(
            status_code=status.HTTP_403_FORBIDDEN,
            detail=f"{host_field}: only an admin registers host paths (the service would read "
            f"them for you); leave {host_field} out and upload the files instead",
        )
    if shared and not token.is_admin:
        raise HTTPException(
            status_code=status.HTTP_403_FORBIDDEN,
            detail="shared: only an admin shares artifacts with every token; leave it false",
        )


@router.post(
    "",
    response_model=TaskSetPublic,
    status_code=status.HTTP_201_CREATED,
    responses={403: {"model": ErrorDetail}, 409: {"model": ErrorDetail}},
)
def create_task_set(
    session: SessionDep, token: CurrentToken, task_set_in: TaskSetCreate
) -> TaskSetPublic:
    """Register a task collection. Without `source`, upload its tasks next; an admin's local
    .jsonl file or folder of tasks is counted; a URI is recorded as given."""
    origin = crud.task_set_origin(task_set_in.source)
    host = task_set_in.source if origin is ArtifactOrigin.HOST else None
    check_admin_fields(token, host_path=host, host_field="source", shared=task_set_in.shared)
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
    """Your task sets and the shared ones."""
    rows, count = crud.list_task_sets(
        session=session,
        token=token,
        skip=skip,
        limit=limit,
        kind=kind.value if kind is not None else None,
    )
    return TaskSetsPublic(data=[TaskSetPublic.model_validate(r) for r in rows], count=count)


@router.get("/{task_set_id}", response_model=TaskSetPublic)
def read_task_set(
    session: SessionDep, token: CurrentToken, task_set_id: uuid.UUID
) -> TaskSetPublic:
    return TaskSetPublic.model_validate(_get(session, token, task_set_id, own=False))


@router.patch("/{task_set_id}", response_model=TaskSetPublic)
def update_task_set(
    session: SessionDep, token: CurrentToken, task_set_id: uuid.UUID, task_set_in: TaskSetUpdate
) -> TaskSetPublic:
    row = crud.update_task_set(
        session=session,
        task_set=_get(session, token, task_set_id, own=True),
        task_set_in=task_set_in,
    )
    session.commit()
    return TaskSetPublic.model_validate(row)


@router.put(
    "/{task_set_id}/files/{file_path:path}",
    response_model=UploadedFile,
    openapi_extra=UPLOAD_OPENAPI,
    responses=UPLOAD_RESPONSES,
)
async def upload_task_file(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    token: CurrentToken,
    task_set_id: uuid.UUID,
    file_path: str,
) -> UploadedFile:
    """Upload one file of the set (SWE-smith: a .jsonl of instances; terminal sets: files of
    task folders, e.g. `task-1/task.yaml`); an existing file is replaced."""
    row = _get(session, token, task_set_id, own=True)
    if row.origin != ArtifactOrigin.UPLOAD:
        raise HTTPException(
            status_code=status.HTTP_409_CONFLICT,
            detail=f"task set {row.name!r} has a {row.origin} source: only task sets created "
            "without a source take uploads",
        )
    saved = await save_upload(
        request, task_set_files_dir(settings, row), file_path, settings.max_upload_bytes
    )
    crud.recount_uploaded_tasks(session=session, settings=settings, task_set=row)
    session.commit()
    return saved


@router.delete("/{task_set_id}", response_model=Message)
def delete_task_set(
    session: SessionDep, settings: SettingsDep, token: CurrentToken, task_set_id: uuid.UUID
) -> Message:
    row = _get(session, token, task_set_id, own=True)
    crud.delete_task_set(session=session, settings=settings, task_set=row)
    session.commit()
    return Message(message=f"task set {task_set_id} deleted")
