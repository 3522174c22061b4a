"""Request and response schemas (separate Create / Update / Public models per resource)."""

from __future__ import annotations

import math
import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from thundersync.rundir import RunStatus

SpanRole = Literal["rollout", "tool", "teacher", "learner", "barrier"]


MAX_NESTING = 64


def _child(path: str, key: Any) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def find_unstorable(data: Any) -> str | None:
    """The first value of a request body that no database stores, as `path: problem and fix`:
    a NUL character (PostgreSQL text cannot hold it), a number that is not finite (NaN and
    Infinity, which Python's JSON parser accepts but JSON columns and responses refuse), or
    nesting deeper than MAX_NESTING levels. Iterative, so any depth is safe to check."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        where = path or "body"
        if isinstance(value, str) and "\x00" in value:
            return f"{where}: contains a NUL character (\\u0000); remove it"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{where}: {value} is not a finite number; use a finite value"
        if isinstance(value, dict | list):
            if depth >= MAX_NESTING:
                return f"{where}: nested more than {MAX_NESTING} levels deep; flatten it"
            items = list(value.items() if isinstance(value, dict) else enumerate(value))
            for key, item in reversed(items):
                if isinstance(key, str) and "\x00" in key:
                    return f"{where}: a key contains a NUL character (\\u0000); remove it"
                stack.append((item, _child(path, key), depth + 1))
    return None


class RequestBody(BaseModel):
    """Base of every request body: unknown fields, NUL characters, NaN / Infinity and deep nesting
    are refused with 422 naming the field, instead of failing later in the database (500)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        problem = find_unstorable(data)
        if problem is not None:
            raise ValueError(problem)
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
    max_active_runs: int | None = Field(
        None,
        ge=0,
        le=100_000,
        description="runs this token may have queued or running at once (None: the service's "
        "default, `--max-active-runs-per-token`; 0: no limit)",
    )

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
    public_id: str = Field(
        description="random public name of the token (`tok_` + 8 characters), unrelated to the "
        "secret: use it to recognise a token in lists and logs, or to revoke it"
    )
    is_admin: bool
    max_active_runs: int | None
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
        None,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        description="recipe name: recipes/NAME.yaml on the server (no paths), e.g. 'grpo-toy'",
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
    skyrl: dict[str, Any] | None = Field(
        None,
        max_length=200,
        description="a SkyRL run instead of a recipe: SkyRL config overrides in dotted form, "
        "as on its command line, e.g. {'trainer.policy.model.path': MODEL, 'data.train_data': "
        "[TASK_SET], 'trainer.train_batch_size': 2}; trained as with "
        "trainer.override_entrypoint=thundersync.skyrl.entrypoint (docs/skyrl.md). The model "
        "and the dataset name artifacts (a skyrl-gym task set); `overrides` adds ThunderSync "
        "settings",
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
    partial: str = Field(
        "", description="output: the last line's current state while it is redrawn (a progress bar)"
    )


class Speedup(BaseModel):
    run_id: uuid.UUID
    baseline_id: uuid.UUID | None = Field(description="a sync run of the same recipe, if any")
    step_s: float | None = Field(description="mean step time of this run")
    baseline_step_s: float | None
    speedup: float | None = Field(description="baseline_step_s / step_s")


class CurvePoint(BaseModel):
    update: int
    t: float = Field(description="seconds since the start of update 0")
    reward: float
    value: float = Field(description="the target metric (TimeToTarget.metric) at this update")


class TimeToTarget(BaseModel):
    run_id: uuid.UUID
    baseline_id: uuid.UUID | None = Field(description="a sync run of the same recipe, if any")
    target: float
    metric: Literal["reward_mean", "kl_mean"] = Field(
        description="the objective's target metric: reward_mean (GRPO; reached at >= target) or "
        "kl_mean, the mean token KL to the teacher (OPD; reached at <= target)"
    )
    lower_is_better: bool = Field(description="true for kl_mean: the target is reached from above")
    curve: list[CurvePoint] = Field(description="this run's target metric per update vs wall time")
    baseline_curve: list[CurvePoint]
    time_to_target_s: float | None = Field(description="None: this run has not reached target")
    baseline_time_to_target_s: float | None
    ratio: float | None = Field(
        description="baseline_time_to_target_s / time_to_target_s: how much sooner this run got there"
    )


# --- updates and spans --------------------------------------------------------------------------


class UpdatePublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    update: int
    schedule: str
    time: float
    step_s: float
    rollout_s: float = Field(description="update start -> the last rollout closed, seconds")
    learner_busy_s: float = Field(description="the learner's busy time in the update, seconds")
    barrier_s: float = Field(description="the barrier: reduce + step + publish, seconds")
    idle_share: float
    mfu: float
    reward_mean: float
    tokens: int
    extra: dict[str, Any]
    # OPD's distillation signal (metrics.jsonl keys, kept in `extra`); None for GRPO
    kl_mean: float | None = Field(
        None, description="OPD: mean sampled reverse KL to the teacher per scored token"
    )
    distill_loss: float | None = Field(
        None, description="OPD: the surrogate loss -sum A log pi / N"
    )
    scored_tokens: int | None = Field(None, description="OPD: the update's scored tokens N")
    # rollout.on_failure: drop (metrics.jsonl keys, kept in `extra`); None: not reported
    dropped_trajectories: int | None = Field(
        None, description="failed trajectories dropped from their group in this update"
    )
    dropped_groups: int | None = Field(
        None, description="GRPO groups dropped whole (left below the estimator's minimum)"
    )
    drop_reasons: dict[str, int] | None = Field(
        None, description="dropped trajectories by reason (error type: first line)"
    )
    # named scores (metrics.jsonl score/<name>, kept in `extra`); None: the tasks report none
    scores: dict[str, float] | None = Field(
        None, description="terminal tasks' named scores (reward.json): the update's mean of each"
    )

    @model_validator(mode="after")
    def _typed_extra(self) -> UpdatePublic:
        ints = ("scored_tokens", "dropped_trajectories", "dropped_groups")
        for key in ("kl_mean", "distill_loss", *ints):
            v = self.extra.get(key)
            if (
                getattr(self, key) is None
                and isinstance(v, int | float)
                and not isinstance(v, bool)
            ):
                setattr(self, key, int(v) if key in ints else float(v))
        reasons = self.extra.get("drop_reasons")
        if self.drop_reasons is None and isinstance(reasons, dict):
            self.drop_reasons = {
                str(k): int(v) for k, v in reasons.items() if isinstance(v, int | float)
            }
        named = {
            k.removeprefix("score/"): float(v)
            for k, v in self.extra.items()
            if k.startswith("score/") and isinstance(v, int | float) and not isinstance(v, bool)
        }
        if self.scores is None and named:
            self.scores = named
        return self


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
