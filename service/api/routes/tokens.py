"""API tokens: admins create, look up and revoke them; anyone can see who they are (GET /tokens/me).

A token is named by its id (UUID) or its public id (`tok_...`); never by any part of its secret.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, status

from thundersync.service import crud
from thundersync.service.api.deps import AdminToken, CurrentToken, Limit, SessionDep, Skip
from thundersync.service.schemas import TokenCreate, TokenCreated, TokenPublic, TokensPublic
from thundersync.service.tables import Token

router = APIRouter(prefix="/tokens", tags=["tokens"])
log = logging.getLogger("tsrl.service")

_UUID = r"[0-9A-Fa-f]{8}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{4}-?[0-9A-Fa-f]{12}"
TokenRef = Annotated[
    str,
    Path(
        pattern=rf"^(tok_[A-Za-z0-9_-]{{8}}|{_UUID})$",
        description="the token's id (UUID) or its public id (tok_...)",
    ),
]


@router.post("", response_model=TokenCreated, status_code=status.HTTP_201_CREATED)
def create_token(session: SessionDep, admin: AdminToken, token_in: TokenCreate) -> TokenCreated:
    """Make a token. The secret is in this response only; the database keeps its SHA-256."""
    row, secret = crud.create_token(session=session, token_in=token_in)
    session.commit()
    log.info("token %s (%s) created by %s", row.public_id, row.name, admin.public_id)
    return TokenCreated(token=secret, **TokenPublic.model_validate(row).model_dump())


@router.get("", response_model=TokensPublic)
def list_tokens(
    session: SessionDep, _admin: AdminToken, skip: Skip = 0, limit: Limit = 100
) -> TokensPublic:
    rows, count = crud.list_tokens(session=session, skip=skip, limit=limit)
    return TokensPublic(data=[TokenPublic.model_validate(r) for r in rows], count=count)


@router.get("/me", response_model=TokenPublic)
def read_own_token(token: CurrentToken) -> TokenPublic:
    return TokenPublic.model_validate(token)


def _find(session: SessionDep, token_id: str) -> Token:
    row = crud.get_token(session=session, token_ref=token_id)
    if row is None:
        raise HTTPException(status_code=404, detail=f"token {token_id} not found")
    return row


@router.get("/{token_id}", response_model=TokenPublic)
def read_token(session: SessionDep, _admin: AdminToken, token_id: TokenRef) -> TokenPublic:
    """One token, by id or public id."""
    return TokenPublic.model_validate(_find(session, token_id))


@router.delete("/{token_id}", response_model=TokenPublic)
def revoke_token(session: SessionDep, admin: AdminToken, token_id: TokenRef) -> TokenPublic:
    """Revoke a token (by id or public id): it gets 401 from then on (its runs stay)."""
    row = crud.revoke_token(session=session, token=_find(session, token_id))
    session.commit()
    log.info("token %s (%s) revoked by %s", row.public_id, row.name, admin.public_id)
    return TokenPublic.model_validate(row)
