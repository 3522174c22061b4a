"""Runs: create from a recipe name or a config, list with paging and filters, get, cancel, delete,
read logs, compare with a sync run of the same recipe."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, status

from thundersync.config import ConfigError, EnvName, load_run_config
from thundersync.rundir import ACTIVE_STATUSES, FINAL_STATUSES, RunFiles, RunStatus
from thundersync.service import crud, crud_recipes
from thundersync.service.api.deps import (
    CurrentToken,
    Limit,
    OwnedRun,
    SessionDep,
    SettingsDep,
    Skip,
    TextFilter,
)
from thundersync.service.api.routes.dashboard import builtin_recipes
from thundersync.service.api.routes.recipes import recipe_data
from thundersync.service.artifacts import ArtifactError, resolve_run_artifacts, resolve_task_set
from thundersync.service.errors import field_error
from thundersync.service.logs import LOG_SOURCES, LogSource, read_run_log
from thundersync.service.schemas import (
    ErrorDetail,
    LogChunk,
    Message,
    RunCreate,
    RunDetail,
    RunsPublic,
    Speedup,
    TimeToTarget,
)
from thundersync.service.tables import Token

router = APIRouter(prefix="/runs", tags=["runs"])

MAX_LOG_CHUNK = 256 * 1024


def config_error(msg: str, loc: list[str | int]) -> HTTPException:
    """422 in FastAPI's validation-error shape, with the config's own message (field + fix)."""
    return field_error(msg, ["body", *loc], "config_error")


def resolve_config(
    run_in: RunCreate, session: SessionDep, settings: SettingsDep, token: Token
) -> Any:
    """The run's config: the token's uploaded recipe of that name, else the shipped one, then
    `config` and `overrides` on top; or the translation of a SkyRL config (`skyrl`)."""
    if run_in.skyrl is not None:
        return skyrl_config(run_in, session, settings, token)
    if run_in.recipe is None and run_in.config is None:
        raise config_error(
            "recipe: give a recipe name (e.g. 'grpo-toy') or a full config in 'config'", ["recipe"]
        )
    try:
        overrides = dict(run_in.overrides)
        if run_in.name is not None:
            overrides["name"] = run_in.name
        mine = None
        if run_in.recipe is not None:
            mine = crud_recipes.get_recipe_by_name(
                session=session, owner_id=token.id, name=run_in.recipe
            )
        if run_in.recipe is not None and mine is None and run_in.recipe not in builtin_recipes():
            raise config_error(recipe_not_found(run_in.recipe, session, token), ["recipe"])
        if mine is not None:  # its fields, then `config` on top, as for a shipped recipe
            data = {**recipe_data(mine.text, mine.name), **(run_in.config or {})}
            return load_run_config(None, overrides, data=data)
        return load_run_config(run_in.recipe, overrides, data=run_in.config)
    except ConfigError as err:
        loc: list[str | int] = ["recipe"] if "recipe" in str(err)[:10] else ["config"]
        raise config_error(str(err), loc) from None
    except (TypeError, ValueError) as err:
        raise config_error(
            f"config: {err}; check the field types against `tsrl config schema`", ["config"]
        ) from None


def skyrl_config(
    run_in: RunCreate, session: SessionDep, settings: SettingsDep, token: Token
) -> Any:
    """A SkyRL run: its overrides parsed by SkyRL's own config, the dataset resolved from the
    token's skyrl-gym task sets, then translated (thundersync.skyrl.translate)."""
    from thundersync.skyrl.dataset import DatasetError

    if run_in.recipe is not None or run_in.config is not None:
        raise config_error(
            "skyrl: a SkyRL run is its SkyRL config: leave recipe and config out (ThunderSync "
            "settings go in overrides)",
            ["skyrl"],
        )
    sky = dict(run_in.skyrl or {})
    data = sky.get("data.train_data")
    names = [data] if isinstance(data, str) else data
    if not (isinstance(names, list) and len(names) == 1 and isinstance(names[0], str)):
        raise config_error(
            "skyrl: data.train_data: name one skyrl-gym task set (GET /api/v1/task-sets), "
            "e.g. ['my-dataset']",
            ["skyrl", "data.train_data"],
        )
    try:
        path = resolve_task_set(session, settings, token, EnvName.SKYRL_DATASET, names[0])
    except ArtifactError as err:
        raise config_error(f"skyrl: data.train_data: {err}", ["skyrl", "data.train_data"]) from None
    sky["data.train_data"] = [path]
    overrides = dict(run_in.overrides) | ({"name": run_in.name} if run_in.name else {})
    try:
        from skyrl.train.config import SkyRLTrainConfig

        from thundersync.skyrl.translate import run_config_from_skyrl
    except ImportError as err:  # a deployment without skyrl: say so, not a 500
        raise config_error(
            f"skyrl: this service cannot read SkyRL configs ({err}); install skyrl as "
            "scripts/setup.sh does (the service image has it)",
            ["skyrl"],
        ) from None
    try:
        return run_config_from_skyrl(SkyRLTrainConfig.from_cli_overrides(sky), overrides)
    except (ConfigError, DatasetError) as err:
        raise config_error(str(err), ["config"]) from None
    except (TypeError, ValueError, AttributeError, LookupError) as err:
        # SkyRL's parser takes any value for a known field: a wrong type fails in the translation
        raise config_error(f"skyrl: {err}", ["skyrl"]) from None


def refuse_unrunnable_tasks(config: Any) -> None:
    """422, one error per task, when a task of the run's set cannot run on its backend
    (`sandbox.envs.taskset_check`; images are checked again with the engine when it starts)."""
    from thundersync.sandbox.envs.taskset_check import check_task_set

    problems, total = check_task_set(config)
    if problems:
        loc: list[str | int] = ["body", "config", "env", "tasks"]
        backend = str(config.env.sandbox)
        detail = [
            {
                "loc": loc,
                "msg": f"env.tasks: task {p.task!r} cannot run on the {backend} backend "
                f"({len(problems)} of {total} cannot): {p.reason}",
                "type": "task_set_error",
            }
            for p in problems[:50]
        ]
        raise HTTPException(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, detail=detail)


def recipe_not_found(name: str, session: SessionDep, token: Token) -> str:
    """What the service takes by name (the CLI's message also offers .yaml paths; not here)."""
    rows, _ = crud_recipes.list_recipes(session=session, token=token, skip=0, limit=50)
    yours = ", ".join(r.name for r in rows) or "none yet"
    return (
        f"recipe {name!r} not found: use one of the built-in recipes "
        f"({', '.join(builtin_recipes())}) or one you uploaded (POST /api/v1/recipes; yours: "
        f"{yours})"
    )


def quota_exceeded(active: int, limit: int) -> HTTPException:
    return HTTPException(
        status_code=status.HTTP_429_TOO_MANY_REQUESTS,
        detail=f"quota: this token has {active} runs queued or running and may have {limit} at "
        "once; wait for one to finish or cancel one (POST /api/v1/runs/{id}/cancel), or ask an "
        "admin for a token with a larger max_active_runs",
        headers={"Retry-After": "30"},
    )


@router.post(
    "",
    response_model=RunDetail,
    status_code=status.HTTP_201_CREATED,
    responses={429: {"model": ErrorDetail, "description": "the token's run quota is used up"}},
)
def create_run(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    token: CurrentToken,
    run_in: RunCreate,
) -> RunDetail:
    """Queue a run. The resolved config is validated now (422 names the field and the fix) and
    stored with the run; the launcher starts it when a slot is free. `model.path`,
    `teacher.model` and `env.tasks` name artifacts (GET /models, GET /task-sets), never host
    paths. 429 when the token already has its quota of runs queued or running."""
    config = resolve_config(run_in, session, settings, token)
    try:
        config = resolve_run_artifacts(session, settings, token, config)
    except ArtifactError as err:
        raise config_error(str(err), ["config", *err.field.split(".")]) from None
    refuse_unrunnable_tasks(config)
    limit = crud.run_quota(token=token, default=settings.max_active_runs_per_token)
    if limit:
        crud.lock_token(session=session, token=token)  # one submission per token at a time (PG)
        active = crud.count_active_runs(session=session, owner_id=token.id)
        if active >= limit:
            raise quota_exceeded(active, limit)
    run = crud.create_run(
        session=session,
        owner=token,
        config=config,
        recipe=run_in.recipe,
        name=run_in.name,
        runs_dir=settings.runs_dir,
        backend=settings.launcher,
    )
    if limit:  # counted again with the new row: SQLite serialises writers, not the check above
        active = crud.count_active_runs(session=session, owner_id=token.id)
        if active > limit:
            session.rollback()
            raise quota_exceeded(active - 1, limit)
    session.commit()
    launcher = getattr(request.app.state, "launcher", None)
    if launcher is not None:
        launcher.wake()
    return RunDetail.model_validate(crud.run_public(run, detail=True).model_dump())


@router.get("", response_model=RunsPublic)
def list_runs(
    session: SessionDep,
    token: CurrentToken,
    skip: Skip = 0,
    limit: Limit = 50,
    status: Annotated[RunStatus | None, Query(description="only runs in this state")] = None,
    recipe: TextFilter = None,
    schedule: TextFilter = None,
    name: Annotated[TextFilter, Query(description="substring of the run name")] = None,
) -> RunsPublic:
    """Your runs, newest first."""
    rows, count = crud.list_runs(
        session=session,
        owner_id=token.id,
        skip=skip,
        limit=limit,
        status=status,
        recipe=recipe,
        schedule=schedule,
        name=name,
    )
    return RunsPublic(data=[crud.run_public(r) for r in rows], count=count)


@router.get("/{run_id}", response_model=RunDetail)
def read_run(run: OwnedRun) -> RunDetail:
    return RunDetail.model_validate(crud.run_public(run, detail=True).model_dump())


@router.post("/{run_id}/cancel", response_model=RunDetail, responses={409: {"model": ErrorDetail}})
def cancel_run(request: Request, session: SessionDep, run: OwnedRun) -> RunDetail:
    """Cancel: a queued run stops at once; a started one stops at its next barrier (never inside an
    optimizer step) and ends as `cancelled`."""
    if run.status in FINAL_STATUSES:
        raise HTTPException(
            status_code=status.HTTP_409_CONFLICT,
            detail=f"run {run.id} already {run.status}: nothing to cancel",
        )
    crud.request_cancel(session=session, run=run)
    session.commit()
    launcher = getattr(request.app.state, "launcher", None)
    if launcher is not None:
        launcher.wake()
    return RunDetail.model_validate(crud.run_public(run, detail=True).model_dump())


@router.delete("/{run_id}", response_model=Message, responses={409: {"model": ErrorDetail}})
def delete_run(session: SessionDep, run: OwnedRun) -> Message:
    """Delete a finished run with its metrics, spans and run directory."""
    if run.status in ACTIVE_STATUSES:
        raise HTTPException(
            status_code=status.HTTP_409_CONFLICT,
            detail=f"run {run.id} is {run.status}: cancel it first (POST /api/v1/runs/{run.id}/cancel)",
        )
    run_id = run.id
    crud.delete_run(session=session, run=run)
    session.commit()
    return Message(message=f"run {run_id} deleted")


@router.get("/{run_id}/logs", response_model=LogChunk)
def read_logs(
    run: OwnedRun,
    offset: Annotated[int, Query(ge=0, le=1 << 40, description="byte offset to read from")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LOG_CHUNK)] = 65536,
    source: Annotated[LogSource, Query(description=LOG_SOURCES)] = "log",
) -> LogChunk:
    """A chunk of the per-update log (default) or of the driver's output, rendered as a terminal
    shows it (progress bars in their last state); resume from `next_offset`."""
    return read_run_log(RunFiles(run.run_dir), source, offset, limit)


@router.get("/{run_id}/speedup", response_model=Speedup)
def read_speedup(session: SessionDep, run: OwnedRun) -> Speedup:
    """Mean step time of the newest sync run of the same recipe divided by this run's."""
    return crud.speedup(session=session, run=run)


@router.get("/{run_id}/time-to-target", response_model=TimeToTarget)
def read_time_to_target(
    session: SessionDep,
    run: OwnedRun,
    target: Annotated[
        float,
        Query(
            allow_inf_nan=False,
            description="GRPO: the mean reward to reach; OPD: the mean token KL to the teacher "
            "to get down to (finite)",
        ),
    ] = 0.5,
) -> TimeToTarget:
    """Wall time until an update reaches `target` on the objective's metric (mean reward >=
    target; OPD: kl_mean <= target), for this run and the newest sync run of the same recipe,
    with both metric-vs-wall-time curves."""
    return crud.time_to_target(session=session, run=run, target=target)
