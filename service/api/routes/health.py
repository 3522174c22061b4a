"""Liveness without auth: for load balancers, `make run` and the tests' wait loops."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from thundersync.service.api.deps import SessionDep
from thundersync.service.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz(session: SessionDep) -> Health:
    session.execute(text("SELECT 1"))
    bind = session.get_bind()
    return Health(database=bind.dialect.name)
