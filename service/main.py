"""The FastAPI app: API routers under /api/v1, /healthz, the dashboard at /, and a lifespan that
migrates the database, registers the admin token and runs the launcher."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from thundersync.service import crud
from thundersync.service.api.routes import dashboard as dashboard_api
from thundersync.service.api.routes import (
    events,
    health,
    models,
    recipes,
    runs,
    spans,
    task_sets,
    tokens,
    updates,
)
from thundersync.service.db import make_engine, make_session_factory, session_scope, upgrade_to_head
from thundersync.service.errors import validation_error_handler
from thundersync.service.limits import BodySizeLimit
from thundersync.service.schemas import ErrorDetail
from thundersync.service.settings import Settings
from thundersync.service.uploads import UPLOAD_PATHS

WEB_DIR = Path(__file__).resolve().parent / "web"
API_PREFIX = "/api/v1"
log = logging.getLogger("tsrl.service")


def api_router() -> APIRouter:
    errors: dict[int | str, dict[str, Any]] = {
        401: {"model": ErrorDetail, "description": "missing, unknown or revoked token"},
        413: {"model": ErrorDetail, "description": "request body over the size limit"},
    }
    router = APIRouter(prefix=API_PREFIX, responses=errors)
    for module in (runs, updates, spans, events, task_sets, models, recipes, dashboard_api):
        router.include_router(
            module.router,
            responses={404: {"model": ErrorDetail, "description": "not found for this token"}},
        )
    router.include_router(
        tokens.router,
        responses={
            403: {"model": ErrorDetail, "description": "needs an admin token"},
            404: {"model": ErrorDetail, "description": "no such token"},
        },
    )
    return router


def create_app(settings: Settings, *, launch: bool = True, backend: Any = None) -> FastAPI:
    """The service app. `launch=False` serves the API without starting drivers (schema tests);
    `backend` replaces the launcher backend chosen by `settings.launcher`."""
    engine = make_engine(settings.db_url)
    factory = make_session_factory(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        upgrade_to_head(engine)
        if settings.admin_token:
            with session_scope(factory) as session:
                crud.ensure_admin_token(session=session, secret=settings.admin_token)
        else:
            log.warning(
                "no admin token: set TSRL_ADMIN_TOKEN or --admin-token-file PATH to create tokens"
            )
        settings.runs_dir.mkdir(parents=True, exist_ok=True)
        launcher = None
        if launch:
            from thundersync.service.launcher import Launcher

            launcher = Launcher(settings, factory, backend)
            launcher.start()
        app.state.launcher = launcher
        try:
            yield
        finally:
            if launcher is not None:
                launcher.stop(stop_runs=settings.stop_runs_on_exit)
            engine.dispose()

    app = FastAPI(
        title="ThunderSync",
        version="0.1.0",
        summary="Streaming GRPO / on-policy distillation training service",
        description="Submit runs, watch their metrics and timelines, manage tokens, models and "
        "task sets. "
        "Every /api/v1 route needs `Authorization: Bearer <token>`.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = factory
    app.state.launcher = None
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.include_router(health.router)
    app.include_router(api_router())
    app.mount("/static", StaticFiles(directory=WEB_DIR / "static"), name="static")

    @app.get("/", include_in_schema=False)
    def dashboard() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:  # browsers ask for it whatever the page links
        return FileResponse(WEB_DIR / "static" / "favicon.svg", media_type="image/svg+xml")

    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        large_paths=UPLOAD_PATHS,
        large_max_bytes=settings.max_upload_bytes,
    )
    return app
