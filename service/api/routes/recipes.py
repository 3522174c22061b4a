"""Recipes: a token uploads its own run-config YAML and names it in `POST /runs {"recipe": NAME}`.

An uploaded recipe is checked when it is uploaded (YAML that parses, a mapping of run-config
fields that validates), so a run from it fails only for what the run adds (overrides, artifacts).
Names are names (no paths); a shipped recipe's name cannot be taken, so `grpo-toy` always means
the shipped one. A token sees and uses only its own recipes.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, HTTPException, status

from thundersync.config import RECIPES_DIR, ConfigError, load_run_config, parse_recipe_text
from thundersync.service import crud_recipes
from thundersync.service.api.deps import CurrentToken, Limit, SessionDep, Skip
from thundersync.service.errors import field_error
from thundersync.service.schemas import ErrorDetail, Message
from thundersync.service.schemas_artifacts import RecipeCreate, RecipePublic, RecipesPublic
from thundersync.service.tables import RecipeArtifact, Token

router = APIRouter(prefix="/recipes", tags=["recipes"])


def recipe_data(text: str, name: str) -> dict[str, Any]:
    """The uploaded text as config fields; a ConfigError naming the upload and the line."""
    data = parse_recipe_text(text, f"{name!r} (uploaded)")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {name!r} (uploaded): top level must be a mapping of fields")
    return data


def _get(session: SessionDep, token: Token, recipe_id: uuid.UUID) -> RecipeArtifact:
    row = crud_recipes.get_recipe(session=session, token=token, recipe_id=recipe_id)
    if row is None:
        raise HTTPException(status_code=404, detail=f"recipe {recipe_id} not found")
    return row


@router.post(
    "",
    response_model=RecipePublic,
    status_code=status.HTTP_201_CREATED,
    responses={409: {"model": ErrorDetail}},
)
def create_recipe(session: SessionDep, token: CurrentToken, recipe_in: RecipeCreate) -> Any:
    """Upload a recipe; 422 names the YAML line or the config field that is wrong."""
    if (RECIPES_DIR / f"{recipe_in.name}.yaml").exists():
        raise HTTPException(
            status_code=status.HTTP_409_CONFLICT,
            detail=f"recipe {recipe_in.name!r} is a shipped recipe: pick another name",
        )
    if crud_recipes.get_recipe_by_name(session=session, owner_id=token.id, name=recipe_in.name):
        raise HTTPException(
            status_code=status.HTTP_409_CONFLICT,
            detail=f"recipe {recipe_in.name!r} exists: pick another name or delete it first",
        )
    try:
        load_run_config(data=recipe_data(recipe_in.yaml, recipe_in.name))
    except ConfigError as err:
        raise field_error(str(err), ["body", "yaml"], "config_error") from None
    except (TypeError, ValueError) as err:
        raise field_error(
            f"recipe {recipe_in.name!r}: {err}; check the field types against `tsrl config schema`",
            ["body", "yaml"],
            "config_error",
        ) from None
    row = crud_recipes.create_recipe(
        session=session,
        owner=token,
        name=recipe_in.name,
        text=recipe_in.yaml,
        description=recipe_in.description,
    )
    session.commit()
    return RecipePublic.model_validate(row)


@router.get("", response_model=RecipesPublic)
def list_recipes(
    session: SessionDep, token: CurrentToken, skip: Skip = 0, limit: Limit = 100
) -> RecipesPublic:
    """Your uploaded recipes (the shipped ones are in recipes/ and `tsrl config list`)."""
    rows, count = crud_recipes.list_recipes(session=session, token=token, skip=skip, limit=limit)
    return RecipesPublic(data=[RecipePublic.model_validate(r) for r in rows], count=count)


@router.get("/{recipe_id}", response_model=RecipePublic)
def read_recipe(session: SessionDep, token: CurrentToken, recipe_id: uuid.UUID) -> Any:
    return RecipePublic.model_validate(_get(session, token, recipe_id))


@router.delete("/{recipe_id}", response_model=Message)
def delete_recipe(session: SessionDep, token: CurrentToken, recipe_id: uuid.UUID) -> Message:
    """Runs already made from it keep their resolved config."""
    row = _get(session, token, recipe_id)
    crud_recipes.delete_recipe(session=session, recipe=row)
    session.commit()
    return Message(message=f"recipe {row.name!r} deleted")
