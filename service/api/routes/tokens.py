"""API tokens: admins create and revoke them; anyone can see who they are (GET /tokens/me)."""

from __future__ import annotations

import uuid

from fastapi import APIRouter, HTTPException, status

from service import crud
from service.api.deps import AdminToken, CurrentToken, Limit, SessionDep, Skip
from service.schemas import TokenCreate, TokenCreated, TokenPublic, TokensPublic

router = APIRouter(prefix="/tokens", tags=["tokens"])


@router.post("", response_model=TokenCreated, status_code=status.HTTP_201_CREATED)
def create_token(session: SessionDep, _admin: AdminToken, token_in: TokenCreate) -> TokenCreated:
    """Make a token. The secret is in this response only; the database keeps its SHA-256."""
    row, secret = crud.create_token(session=session, token_in=token_in)
    session.commit()
    return TokenCreated(token=secret, **TokenPublic.model_validate(row).model_dump())


@router.get("", response_model=TokensPublic)
def list_tokens(session: SessionDep, _admin: AdminToken, skip: Skip = 0, limit: Limit = 100):
    rows, count = crud.list_tokens(session=session, skip=skip, limit=limit)
    return TokensPublic(data=[TokenPublic.model_validate(r) for r in rows], count=count)


@router.get("/me", response_model=TokenPublic)
def read_own_token(token: CurrentToken) -> TokenPublic:
    return TokenPublic.model_validate(token)


@router.delete("/{token_id}", response_model=TokenPublic)
def revoke_token(session: SessionDep, _admin: AdminToken, token_id: uuid.UUID) -> TokenPublic:
    """Revoke a token: it gets 401 from then on (its runs stay in the database)."""
    row = crud.get_token(session=session, token_id=token_id)
    if row is None:
        raise HTTPException(status_code=404, detail=f"token {token_id} not found")
    crud.revoke_token(session=session, token=row)
    session.commit()
    return TokenPublic.model_validate(row)
