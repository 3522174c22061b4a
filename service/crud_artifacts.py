"""Database operations on artifacts (task sets, models), keyword-only, scoped to the token.

A token lists and reads its own artifacts and the shared ones; it changes and deletes only its own.
Where an artifact's files are (`origin`) is decided here: a URI is recorded, a host path only for an
admin (the route refuses it otherwise, before this is called), no source means uploads.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from thundersync.service.artifacts import (
    is_uri,
    model_files_dir,
    task_set_files_dir,
    task_set_local_path,
    visible,
)
from thundersync.service.schemas_artifacts import ModelCreate, TaskSetCreate, TaskSetUpdate
from thundersync.service.settings import Settings
from thundersync.service.tables import ArtifactOrigin, ModelArtifact, TaskSet, Token

# --- task sets ----------------------------------------------------------------------------------


def count_local_tasks(source: str | None) -> int | None:
    """Tasks at a local source: lines of a .jsonl file, or task directories of a folder."""
    if source is None:
        return None
    path = Path(source)
    try:
        if path.is_file() and path.suffix == ".jsonl":
            with path.open("rb") as f:
                return sum(1 for line in f if line.strip())
        if path.is_dir():
            return sum(1 for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return None
    return None


def task_set_origin(source: str | None) -> ArtifactOrigin:
    if source is None:
        return ArtifactOrigin.UPLOAD
    return ArtifactOrigin.URI if is_uri(source) else ArtifactOrigin.HOST


def create_task_set(*, session: Session, owner: Token, task_set_in: TaskSetCreate) -> TaskSet:
    origin = task_set_origin(task_set_in.source)
    row = TaskSet(
        owner_id=owner.id,
        name=task_set_in.name,
        kind=task_set_in.kind.value,
        source=task_set_in.source or "",
        origin=origin.value,
        shared=task_set_in.shared,
        description=task_set_in.description,
        # only an admin's host path is read (the route refuses any other one)
        task_count=count_local_tasks(task_set_in.source) if origin is ArtifactOrigin.HOST else None,
        meta=task_set_in.meta,
    )
    session.add(row)
    session.flush()
    return row


def recount_uploaded_tasks(*, session: Session, settings: Settings, task_set: TaskSet) -> None:
    task_set.task_count = count_local_tasks(task_set_local_path(settings, task_set))
    session.flush()


def get_task_set_by_name(*, session: Session, owner_id: uuid.UUID, name: str) -> TaskSet | None:
    return session.scalar(select(TaskSet).where(TaskSet.owner_id == owner_id, TaskSet.name == name))


def list_task_sets(
    *, session: Session, token: Token, skip: int, limit: int, kind: str | None = None
) -> tuple[list[TaskSet], int]:
    query = visible(TaskSet, token)
    if kind is not None:
        query = query.where(TaskSet.kind == kind)
    count = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(TaskSet.name, TaskSet.id).offset(skip).limit(limit))
    return list(rows), count


def get_task_set(
    *, session: Session, token: Token, task_set_id: uuid.UUID, own: bool = False
) -> TaskSet | None:
    """A task set the token may read (`own`: one it may change), else None."""
    row = session.get(TaskSet, task_set_id)
    if row is None or not (row.owner_id == token.id or (row.shared and not own)):
        return None
    return row


def update_task_set(*, session: Session, task_set: TaskSet, task_set_in: TaskSetUpdate) -> TaskSet:
    if task_set_in.description is not None:
        task_set.description = task_set_in.description
    if task_set_in.meta is not None:
        task_set.meta = task_set_in.meta
    session.flush()
    return task_set


def delete_task_set(*, session: Session, settings: Settings, task_set: TaskSet) -> None:
    folder = task_set_files_dir(settings, task_set)
    uploaded = task_set.origin == ArtifactOrigin.UPLOAD
    session.delete(task_set)
    session.flush()
    if uploaded:
        shutil.rmtree(folder, ignore_errors=True)


# --- models -------------------------------------------------------------------------------------


def get_model_by_name(*, session: Session, owner_id: uuid.UUID, name: str) -> ModelArtifact | None:
    return session.scalar(
        select(ModelArtifact).where(ModelArtifact.owner_id == owner_id, ModelArtifact.name == name)
    )


def create_model(*, session: Session, owner: Token, model_in: ModelCreate) -> ModelArtifact:
    row = ModelArtifact(
        owner_id=owner.id,
        name=model_in.name,
        origin=(ArtifactOrigin.HOST if model_in.path else ArtifactOrigin.UPLOAD).value,
        path=model_in.path,
        description=model_in.description,
        shared=model_in.shared,
    )
    session.add(row)
    session.flush()
    return row


def list_models(
    *, session: Session, token: Token, skip: int, limit: int
) -> tuple[list[ModelArtifact], int]:
    query = visible(ModelArtifact, token)
    count = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(
        query.order_by(ModelArtifact.name, ModelArtifact.id).offset(skip).limit(limit)
    )
    return list(rows), count


def get_model(
    *, session: Session, token: Token, model_id: uuid.UUID, own: bool = False
) -> ModelArtifact | None:
    row = session.get(ModelArtifact, model_id)
    if row is None or not (row.owner_id == token.id or (row.shared and not own)):
        return None
    return row


def delete_model(*, session: Session, settings: Settings, model: ModelArtifact) -> None:
    folder = model_files_dir(settings, model)
    uploaded = model.origin == ArtifactOrigin.UPLOAD
    session.delete(model)
    session.flush()
    if uploaded:
        shutil.rmtree(folder, ignore_errors=True)
