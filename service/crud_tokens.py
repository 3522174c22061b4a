"""Token operations (see service/crud.py): lookup by secret digest or by id / public id, the
configured admin token, create, list, revoke. No part of a secret is stored."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from thundersync.service.db import utcnow
from thundersync.service.schemas import TokenCreate
from thundersync.service.security import PUBLIC_ID_PREFIX, hash_token, new_public_id, new_token
from thundersync.service.tables import Token


def get_token_by_secret(*, session: Session, secret: str) -> Token | None:
    row = session.scalar(select(Token).where(Token.token_hash == hash_token(secret)))
    if row is None or row.revoked_at is not None:
        return None
    return row


def unused_public_id(*, session: Session) -> str:
    """A fresh random public id (48 random bits: a clash is rare, but checked)."""
    while True:
        public_id = new_public_id()
        if session.scalar(select(Token.id).where(Token.public_id == public_id)) is None:
            return public_id


CONFIGURED_ADMIN = "admin"


def ensure_admin_token(*, session: Session, secret: str) -> Token:
    """Register the configured admin token (by digest); re-enable it if it was revoked. An admin
    token configured on an earlier start (another secret) is revoked: only the current one works.
    Runs keep their owner, so runs of an earlier admin token become invisible, not deleted."""
    digest = hash_token(secret)
    for old in session.scalars(
        select(Token).where(
            Token.name == CONFIGURED_ADMIN,
            Token.is_admin.is_(True),
            Token.token_hash != digest,
            Token.revoked_at.is_(None),
        )
    ):
        old.revoked_at = utcnow()
    row = session.scalar(select(Token).where(Token.token_hash == digest))
    if row is None:
        row = Token(
            name=CONFIGURED_ADMIN,
            token_hash=digest,
            public_id=unused_public_id(session=session),
            is_admin=True,
        )
        session.add(row)
    else:
        row.is_admin = True
        row.revoked_at = None
    session.flush()
    return row


def create_token(*, session: Session, token_in: TokenCreate) -> tuple[Token, str]:
    secret = new_token()
    row = Token(
        name=token_in.name,
        token_hash=hash_token(secret),
        public_id=unused_public_id(session=session),
        is_admin=token_in.is_admin,
        max_active_runs=token_in.max_active_runs,
    )
    session.add(row)
    session.flush()
    return row, secret


def list_tokens(*, session: Session, skip: int, limit: int) -> tuple[list[Token], int]:
    count = session.scalar(select(func.count()).select_from(Token)) or 0
    rows = session.scalars(select(Token).order_by(Token.created_at).offset(skip).limit(limit))
    return list(rows), count


def get_token(*, session: Session, token_ref: str) -> Token | None:
    """A token by its id (UUID) or its public id (`tok_...`)."""
    if token_ref.startswith(PUBLIC_ID_PREFIX):
        return session.scalar(select(Token).where(Token.public_id == token_ref))
    try:
        token_id = uuid.UUID(token_ref)
    except ValueError:
        return None
    return session.get(Token, token_id)


def revoke_token(*, session: Session, token: Token) -> Token:
    if token.revoked_at is None:
        token.revoked_at = utcnow()
    session.flush()
    return token
