"""What the dashboard's forms and lists read: the run-config JSON schema (`tsrl config schema`),
the recipes a run can start from (built-in and uploaded), and per-run summaries (reward, median
step time, speedup over the sync baseline) for a page of runs."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

import yaml
from fastapi import APIRouter, Query

from thundersync import config
from thundersync.config import RunConfig
from thundersync.service import crud_recipes, crud_summary
from thundersync.service.api.deps import CurrentToken, SessionDep
from thundersync.service.schemas_dashboard import RecipeChoice, RecipeChoices, RunSummaries

router = APIRouter(tags=["dashboard"])

MAX_SUMMARY_IDS = 200


def builtin_recipes() -> list[str]:
    """The names of the recipes shipped with the service (recipes/NAME.yaml)."""
    return sorted(p.stem for p in config.RECIPES_DIR.glob("*.yaml"))  # read now, not at import


def _choice(
    name: str, origin: Literal["built-in", "uploaded"], text: str, description: str = ""
) -> RecipeChoice:
    """A recipe's headline fields; a recipe that does not parse still lists (its run will say why)."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError:
        data = None
    fields: dict[str, Any] = data if isinstance(data, dict) else {}
    get = lambda k: str(fields[k]) if isinstance(fields.get(k), str | int) else None  # noqa: E731
    updates = fields.get("updates")
    return RecipeChoice(
        name=name,
        origin=origin,
        objective=get("objective"),
        schedule=get("schedule"),
        updates=updates if isinstance(updates, int) and not isinstance(updates, bool) else None,
        description=description,
    )


@router.get("/config/schema")
def read_config_schema(_token: CurrentToken) -> dict[str, Any]:
    """The run config's JSON schema (as `tsrl config schema`): the fields `config` and
    `overrides` of POST /runs take, with their types, limits and descriptions."""
    return RunConfig.model_json_schema()


@router.get("/config/recipes", response_model=RecipeChoices)
def list_recipe_choices(session: SessionDep, token: CurrentToken) -> RecipeChoices:
    """Every recipe POST /runs accepts by name: the built-in ones, then your uploaded ones."""
    shipped = [
        _choice(n, "built-in", (config.RECIPES_DIR / f"{n}.yaml").read_text(encoding="utf-8"))
        for n in builtin_recipes()
    ]
    rows, _ = crud_recipes.list_recipes(session=session, token=token, skip=0, limit=1000)
    mine = [_choice(r.name, "uploaded", r.text, r.description) for r in rows]
    return RecipeChoices(data=shipped + mine)


@router.get("/run-summaries", response_model=RunSummaries)
def list_run_summaries(
    session: SessionDep,
    token: CurrentToken,
    ids: Annotated[
        list[uuid.UUID],
        Query(max_length=MAX_SUMMARY_IDS, description="run ids (repeat the parameter)"),
    ],
) -> RunSummaries:
    """Reward (or the objective's own target metric), median step time and speedup over the
    sync run of the same recipe, for each of your runs among `ids` (others are left out)."""
    return RunSummaries(data=crud_summary.summarise(session=session, owner_id=token.id, ids=ids))
