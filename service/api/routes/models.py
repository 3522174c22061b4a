"""Models: the model directories runs start from (`model.path`) or distil from (`teacher.model`),
named in a run config by name or id.

A model's files are uploaded into the service's data dir (no `path`, then
`PUT /models/{id}/files/PATH` for config.json, the safetensors and the tokenizer files), or an admin
registers a host directory (`path`). A token sees its own models and the shared ones.
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, HTTPException, Request, status

from thundersync.service import crud
from thundersync.service.api.deps import CurrentToken, Limit, SessionDep, SettingsDep, Skip
from thundersync.service.api.routes.task_sets import check_admin_fields
from thundersync.service.artifacts import model_files_dir
from thundersync.service.schemas import ErrorDetail, Message
from thundersync.service.schemas_artifacts import (
    ModelCreate,
    ModelPublic,
    ModelsPublic,
    UploadedFile,
)
from thundersync.service.tables import ArtifactOrigin, ModelArtifact, Token
from thundersync.service.uploads import UPLOAD_OPENAPI, UPLOAD_RESPONSES, save_upload

router = APIRouter(prefix="/models", tags=["models"])


def _get(session: SessionDep, token: Token, model_id: uuid.UUID, own: bool) -> ModelArtifact:
    row = crud.get_model(session=session, token=token, model_id=model_id, own=own)
    if row is None:
        raise HTTPException(status_code=404, detail=f"model {model_id} not found")
    return row


@router.post(
    "",
    response_model=ModelPublic,
    status_code=status.HTTP_201_CREATED,
    responses={403: {"model": ErrorDetail}, 409: {"model": ErrorDetail}},
)
def create_model(session: SessionDep, token: CurrentToken, model_in: ModelCreate) -> ModelPublic:
    """Register a model: without `path`, upload its files next; with one (admins), the host
    directory is used as it is (the service does not look at it now)."""
    check_admin_fields(token, host_path=model_in.path, host_field="path", shared=model_in.shared)
    if crud.get_model_by_name(session=session, owner_id=token.id, name=model_in.name):
        raise HTTPException(
            status_code=status.HTTP_409_CONFLICT,
            detail=f"model {model_in.name!r} exists: pick another name or delete it first",
        )
    row = crud.create_model(session=session, owner=token, model_in=model_in)
    session.commit()
    return ModelPublic.model_validate(row)


@router.get("", response_model=ModelsPublic)
def list_models(
    session: SessionDep, token: CurrentToken, skip: Skip = 0, limit: Limit = 100
) -> ModelsPublic:
    """Your models and the shared ones."""
    rows, count = crud.list_models(session=session, token=token, skip=skip, limit=limit)
    return ModelsPublic(data=[ModelPublic.model_validate(r) for r in rows], count=count)


@router.get("/{model_id}", response_model=ModelPublic)
def read_model(session: SessionDep, token: CurrentToken, model_id: uuid.UUID) -> ModelPublic:
    return ModelPublic.model_validate(_get(session, token, model_id, own=False))


@router.put(
    "/{model_id}/files/{file_path:path}",
    response_model=UploadedFile,
    openapi_extra=UPLOAD_OPENAPI,
    responses=UPLOAD_RESPONSES,
)
async def upload_model_file(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    token: CurrentToken,
    model_id: uuid.UUID,
    file_path: str,
) -> UploadedFile:
    """Upload one file of the model (an existing file is replaced)."""
    row = _get(session, token, model_id, own=True)
    if row.origin != ArtifactOrigin.UPLOAD:
        raise HTTPException(
            status_code=status.HTTP_409_CONFLICT,
            detail=f"model {row.name!r} is a registered host path: only models created without "
            "a path take uploads",
        )
    return await save_upload(
        request, model_files_dir(settings, row), file_path, settings.max_upload_bytes
    )


@router.delete("/{model_id}", response_model=Message)
def delete_model(
    session: SessionDep, settings: SettingsDep, token: CurrentToken, model_id: uuid.UUID
) -> Message:
    """Delete a model (its uploaded files too). Runs already queued keep the path they got."""
    crud.delete_model(
        session=session, settings=settings, model=_get(session, token, model_id, own=True)
    )
    session.commit()
    return Message(message=f"model {model_id} deleted")
