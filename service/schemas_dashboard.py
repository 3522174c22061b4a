"""Response schemas the dashboard reads: per-run summaries for the runs list and the comparison
view, and the recipes a run can start from (built-in and uploaded) for the submit form."""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, Field


class RunSummary(BaseModel):
    run_id: uuid.UUID
    updates: int = Field(description="updates ingested so far")
    metric: str = Field(
        description="the objective's target metric shown as `value`: reward_mean for GRPO; for "
        "OPD the KL to the teacher where the run reports it, else reward_mean"
    )
    value: float | None = Field(description="the last update's `metric`")
    reward: float | None = Field(description="the last update's reward_mean")
    step_s_median: float | None = Field(description="median step time, seconds")
    baseline_id: uuid.UUID | None = Field(description="the sync run of the same recipe, if any")
    speedup: float | None = Field(
        description="mean step time of the sync baseline / this run's (as GET /runs/{id}/speedup)"
    )


class RunSummaries(BaseModel):
    data: list[RunSummary]


class RecipeChoice(BaseModel):
    name: str
    origin: Literal["built-in", "uploaded"]
    objective: str | None = Field(description="the recipe's objective (None: the default)")
    schedule: str | None = Field(description="the recipe's schedule (None: the default)")
    updates: int | None
    description: str


class RecipeChoices(BaseModel):
    data: list[RecipeChoice]
