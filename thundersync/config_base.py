"""The base of every config section: unknown fields are errors, numbers finite, ints 64-bit."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _Section(BaseModel):
    """Base of every config section (and of RunConfig): unknown fields are errors, numbers are
    finite (no NaN / Infinity: JSON and the databases have none) and integers fit in 64 bits."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _int64(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX:
            raise ValueError(
                f"out of range: use an integer from {INT64_MIN} to {INT64_MAX} (64-bit)"
            )
        return v
