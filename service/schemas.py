"""Request and response schemas (separate Create / Update / Public models per resource)."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tsrl.rundir import RunStatus

SpanRole = Literal["rollout", "tool", "teacher", "learner", "barrier"]


def _find_nul(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for k, v in value.items():
            hit = _find_nul(k, path) or _find_nul(v, f"{path}.{k}" if path else str(k))
            if hit is not None:
                return hit
    if isinstance(value, list):
        for i, v in enumerate(value):
            hit = _find_nul(v, f"{path}[{i}]")
            if hit is not None:
                return hit
    return None


class RequestBody(BaseModel):
    """Base of every request body: unknown fields and NUL characters are refused (PostgreSQL
    cannot store NUL in text, so it is rejected up front with 422 instead of failing later)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _no_nul(cls, data: Any) -> Any:
        hit = _find_nul(data, "")
        if hit is not None:
            raise ValueError(f"{hit or 'body'}: contains a NUL character (\\u0000); remove it")
        return data


class Message(BaseModel):
    message: str


class ErrorDetail(BaseModel):
    """Error body for 401 / 403 / 404 / 409 / 413: what went wrong and how to fix it."""

    detail: str


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    database: str


# --- tokens -------------------------------------------------------------------------------------


class TokenCreate(RequestBody):
    name: str = Field(
        min_length=1,
        max_length=100,
        description="who or what uses the token ('admin' is reserved for the configured one)",
    )
    is_admin: bool = Field(False, description="admins create and revoke tokens")

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v == "admin":
            raise ValueError(
                "'admin' is reserved for the token given to `tsrl serve`: pick another"
            )
        return v


class TokenPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: uuid.UUID
    name: str
    prefix: str = Field(description="first characters of the secret, to recognise it")
    is_admin: bool
    created_at: datetime
    revoked_at: datetime | None


class TokenCreated(TokenPublic):
    token: str = Field(description="the secret; shown only in this response, stored hashed")


class TokensPublic(BaseModel):
    data: list[TokenPublic]
    count: int


# --- runs ---------------------------------------------------------------------------------------


class RunCreate(RequestBody):
    recipe: str | None = Field(
        None, max_length=200, description="recipe name (recipes/NAME.yaml), e.g. 'grpo-toy'"
    )
    config: dict[str, Any] | None = Field(
        None, description="a full or partial run config (applied on top of the recipe, if any)"
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="dotted keys applied last, e.g. {'optim.lr': 0.01}"
    )
    name: str | None = Field(
        None,
        max_length=200,
        description="run name (sets the config's `name`); default: the config's",
    )


class RunPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: uuid.UUID
    name: str
    recipe: str | None
    objective: str
    schedule: str
    status: RunStatus
    reason: str
    backend: str
    updates_total: int
    updates_done: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    cancel_requested: bool


class RunDetail(RunPublic):
    config: dict[str, Any]


class RunsPublic(BaseModel):
    data: list[RunPublic]
    count: int


class LogChunk(BaseModel):
    text: str
    offset: int
    next_offset: int
    size: int


class Speedup(BaseModel):
    run_id: uuid.UUID
    baseline_id: uuid.UUID | None = Field(description="a sync run of the same recipe, if any")
    step_s: float | None = Field(description="mean step time of this run")
    baseline_step_s: float | None
    speedup: float | None = Field(description="baseline_step_s / step_s")


# --- updates and spans --------------------------------------------------------------------------


class UpdatePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    update: int
    schedule: str
    time: float
    step_s: float
    R: float
    L: float
    P: float
    idle_share: float
    mfu: float
    reward_mean: float
    tokens: int
    extra: dict[str, Any]


class UpdatesPublic(BaseModel):
    data: list[UpdatePublic]
    count: int


class SpanPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    update: int
    role: str
    kind: str
    start: float
    end: float
    ready: float | None
    ids: dict[str, Any]


class SpansPublic(BaseModel):
    data: list[SpanPublic]
    count: int
    t0: float | None = Field(description="start of the run's first span (timeline origin)")


# --- task sets ----------------------------------------------------------------------------------


class TaskSetKind(StrEnum):
    SWE_SMITH = "swe-smith"
    SETA = "seta"
    TERMINAL_BENCH = "terminal-bench"
    HARBOR = "harbor"
    SKYRL_GYM = "skyrl-gym"


class TaskSetCreate(RequestBody):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._-]+$")
    kind: TaskSetKind
    source: str = Field(
        min_length=1, max_length=2000, description="directory, JSONL file or dataset URI"
    )
    description: str = Field("", max_length=5000)
    meta: dict[str, Any] = Field(default_factory=dict)


class TaskSetUpdate(RequestBody):
    description: str | None = Field(None, max_length=5000)
    meta: dict[str, Any] | None = None


class TaskSetPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: uuid.UUID
    name: str
    kind: str
    source: str
    description: str
    task_count: int | None = Field(description="tasks found at a local source; None if unknown")
    meta: dict[str, Any]
    created_at: datetime


class TaskSetsPublic(BaseModel):
    data: list[TaskSetPublic]
    count: int
