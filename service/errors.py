"""422 bodies that always serialise: FastAPI echoes each error's `input`, which can hold NaN or
Infinity (Python's JSON parser accepts them, JSON responses refuse them) or a deeply nested value
(the encoder recurses): either turned a 422 into a 500. Here an error keeps its `type`, `loc` and
`msg`; `input` and `ctx` only when they are plain JSON scalars."""

from __future__ import annotations

import math
from typing import Any

from fastapi import HTTPException, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


def _scalar(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, str | int | bool)


def _short(value: Any) -> Any:
    return value[:200] if isinstance(value, str) else value


def safe_error(error: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": str(error.get("type", "value_error")),
        "loc": [p if isinstance(p, int) else str(p) for p in error.get("loc", ())],
        "msg": str(error.get("msg", "")),
    }
    if _scalar(error.get("input")) and "input" in error:
        out["input"] = _short(error["input"])
    ctx = error.get("ctx")
    if isinstance(ctx, dict):
        out["ctx"] = {str(k): v if _scalar(v) else str(v) for k, v in ctx.items()}
    return out


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    return JSONResponse(status_code=422, content={"detail": [safe_error(e) for e in errors]})


def field_error(msg: str, loc: list[str | int], kind: str = "value_error") -> HTTPException:
    """A 422 in FastAPI's validation-error shape (`HTTPValidationError`) for a check made in a
    route: `loc` names the field (e.g. ["body", "config", "model", "path"])."""
    return HTTPException(
        status_code=status.HTTP_422_UNPROCESSABLE_CONTENT,
        detail=[{"loc": loc, "msg": msg, "type": kind}],
    )
