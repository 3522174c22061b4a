"""Uploaded recipes: a token's own run-config YAML files, by name (keyword-only, as crud)."""

from __future__ import annotations

import uuid

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from thundersync.service.tables import RecipeArtifact, Token


def get_recipe_by_name(
    *, session: Session, owner_id: uuid.UUID, name: str
) -> RecipeArtifact | None:
    return session.scalar(
        select(RecipeArtifact).where(
            RecipeArtifact.owner_id == owner_id, RecipeArtifact.name == name
        )
    )


def get_recipe(*, session: Session, token: Token, recipe_id: uuid.UUID) -> RecipeArtifact | None:
    """The token's own recipe (another token's is not found)."""
    row = session.get(RecipeArtifact, recipe_id)
    return row if row is not None and row.owner_id == token.id else None


def create_recipe(
    *, session: Session, owner: Token, name: str, text: str, description: str
) -> RecipeArtifact:
    row = RecipeArtifact(owner_id=owner.id, name=name, text=text, description=description)
    session.add(row)
    session.flush()
    return row


def list_recipes(
    *, session: Session, token: Token, skip: int, limit: int
) -> tuple[list[RecipeArtifact], int]:
    query = select(RecipeArtifact).where(RecipeArtifact.owner_id == token.id)
    count = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(
        query.order_by(RecipeArtifact.name, RecipeArtifact.id).offset(skip).limit(limit)
    )
    return list(rows), count


def delete_recipe(*, session: Session, recipe: RecipeArtifact) -> None:
    session.delete(recipe)
    session.flush()
