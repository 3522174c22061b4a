"""Shared `Annotated` dependencies: the database session, the bearer token, the owned run.

Auth: `Authorization: Bearer <token>`; a missing, unknown or revoked token is 401. A run or task set
of another token is reported as 404 (its existence is not revealed).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Query, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from thundersync.service import crud
from thundersync.service.settings import Settings
from thundersync.service.tables import Run, Token

bearer_scheme = HTTPBearer(
    auto_error=False,
    description="An API token: the admin token given to `tsrl serve`, or one made by POST /tokens",
)


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_db(request: Request) -> Iterator[Session]:
    with request.app.state.session_factory() as session:
        try:
            yield session
        except BaseException:
            session.rollback()
            raise


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_db)]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_401_UNAUTHORIZED,
        detail=detail,
        headers={"WWW-Authenticate": "Bearer"},
    )


def get_current_token(
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Token:
    if credentials is None or not credentials.credentials:
        raise _unauthorized("missing token: send the header 'Authorization: Bearer <token>'")
    token = crud.get_token_by_secret(session=session, secret=credentials.credentials)
    if token is None:
        raise _unauthorized("invalid or revoked token: ask an admin for a token (POST /tokens)")
    return token


CurrentToken = Annotated[Token, Depends(get_current_token)]


def get_admin_token(token: CurrentToken) -> Token:
    if not token.is_admin:
        raise HTTPException(
            status_code=status.HTTP_403_FORBIDDEN,
            detail="this needs an admin token (the one `tsrl serve` reads from TSRL_ADMIN_TOKEN or "
            "--admin-token-file)",
        )
    return token


AdminToken = Annotated[Token, Depends(get_admin_token)]

RunId = Annotated[uuid.UUID, Path(description="run id (from POST /runs or GET /runs)")]


def get_owned_run(session: SessionDep, token: CurrentToken, run_id: RunId) -> Run:
    run = crud.get_run(session=session, owner_id=token.id, run_id=run_id)
    if run is None:
        raise HTTPException(status_code=404, detail=f"run {run_id} not found")
    return run


OwnedRun = Annotated[Run, Depends(get_owned_run)]

# Query parameters with bounds every database accepts (PostgreSQL rejects NUL bytes and int64
# overflow, which would otherwise surface as 500s).
SAFE_TEXT = r"^[^\x00-\x1f]*$"
Skip = Annotated[int, Query(ge=0, le=1_000_000_000, description="rows to skip")]
Limit = Annotated[int, Query(ge=1, le=1000, description="rows to return (at most 1000)")]
TextFilter = Annotated[str | None, Query(max_length=200, pattern=SAFE_TEXT)]
