"""The base of every config section: unknown fields are errors, numbers finite, ints 64-bit,
strings storable (no NUL, no lone surrogate: PostgreSQL refuses both, SQLite would keep them)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class _Section(BaseModel):
    """Base of every config section (and of RunConfig): unknown fields are errors, numbers are
    finite (no NaN / Infinity: JSON and the databases have none), integers fit in 64 bits and
    strings hold no NUL or lone surrogate (the service stores every config)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _int64(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool) and not INT64_MIN <= v <= INT64_MAX:
            raise ValueError(
                f"out of range: use an integer from {INT64_MIN} to {INT64_MAX} (64-bit)"
            )
        return v

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, v: Any) -> Any:
        for text in _strings(v):
            if "\x00" in text:
                raise ValueError(
                    "contains a NUL character (\\x00), which no database stores: remove it"
                )
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(
                    "contains a lone surrogate (not valid Unicode text): remove or fix it"
                ) from None
        return v


def _strings(v: Any) -> list[str]:
    """Every string in a field's value, inside lists and dicts too (keys included)."""
    if isinstance(v, str):
        return [v]
    if isinstance(v, dict):
        return [s for k, x in v.items() for s in (*_strings(k), *_strings(x))]
    if isinstance(v, list | tuple | set):
        return [s for x in v for s in _strings(x)]
    return []
