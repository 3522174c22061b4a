"""Request and response schemas of the artifacts: task sets and models.

An artifact's files are a host path an admin registered, files uploaded into the service's data dir
(`PUT .../files/PATH`), or, for task sets, a dataset URI the service records but never reads. Run
configs name artifacts (by name or id), never host paths.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from thundersync.service.schemas import RequestBody

ARTIFACT_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
SHARED_HELP = "admins only: every token may use it (read-only)"


class TaskSetKind(StrEnum):
    SWE_SMITH = "swe-smith"
    SETA = "seta"
    TERMINAL_BENCH = "terminal-bench"
    HARBOR = "harbor"
    SKYRL_GYM = "skyrl-gym"


class TaskSetCreate(RequestBody):
    name: str = Field(min_length=1, max_length=200, pattern=ARTIFACT_NAME)
    kind: TaskSetKind
    source: str | None = Field(
        None,
        min_length=1,
        max_length=2000,
        description="a dataset URI (scheme://..., recorded, never read), or a host directory / "
        "JSONL file (admins only); leave it out to upload the tasks (PUT .../files/PATH)",
    )
    description: str = Field("", max_length=5000)
    meta: dict[str, Any] = Field(default_factory=dict)
    shared: bool = Field(False, description=SHARED_HELP)


class TaskSetUpdate(RequestBody):
    description: str | None = Field(None, max_length=5000)
    meta: dict[str, Any] | None = None


class TaskSetPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: uuid.UUID
    name: str
    kind: str
    source: str = Field(description="the registered path or URI; empty for uploaded task sets")
    origin: str = Field(description="host | upload | uri")
    shared: bool
    description: str
    task_count: int | None = Field(description="tasks found at a local source; None if unknown")
    meta: dict[str, Any]
    created_at: datetime


class TaskSetsPublic(BaseModel):
    data: list[TaskSetPublic]
    count: int


class ModelCreate(RequestBody):
    name: str = Field(min_length=1, max_length=200, pattern=ARTIFACT_NAME)
    path: str | None = Field(
        None,
        min_length=1,
        max_length=2000,
        pattern=r"^[^\x00-\x1f]*$",
        description="admins only: a host directory holding the model; leave it out to upload "
        "the files (PUT /api/v1/models/{id}/files/PATH: config.json, *.safetensors, tokenizer)",
    )
    description: str = Field("", max_length=5000)
    shared: bool = Field(False, description=SHARED_HELP)


class ModelPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: uuid.UUID
    name: str
    origin: str = Field(description="host | upload")
    path: str | None = Field(description="the registered host path (None for uploads)")
    shared: bool
    description: str
    created_at: datetime


class ModelsPublic(BaseModel):
    data: list[ModelPublic]
    count: int


class UploadedFile(BaseModel):
    path: str = Field(description="the file's path inside the artifact")
    size: int


RECIPE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"  # as POST /runs takes it: a name, never a path


class RecipeCreate(RequestBody):
    name: str = Field(min_length=1, max_length=200, pattern=RECIPE_NAME)
    yaml: str = Field(
        min_length=1,
        max_length=65536,
        description="the recipe file's text: run config fields as YAML (as recipes/*.yaml)",
    )
    description: str = Field("", max_length=5000)


class RecipePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: uuid.UUID
    name: str
    yaml: str = Field(validation_alias="text")
    description: str
    created_at: datetime


class RecipesPublic(BaseModel):
    data: list[RecipePublic]
    count: int
