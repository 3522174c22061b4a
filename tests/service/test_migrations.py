"""Alembic owns the schema: upgrade from empty, the models match the migrations (no pending
autogenerate diff), and downgrade/upgrade round-trips on both databases."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import inspect

import service.models  # noqa: F401
from alembic import command
from service.db import ALEMBIC_DIR, Base, make_engine, upgrade_to_head


def test_migrations_match_models_and_round_trip(database_url: str) -> None:
    engine = make_engine(database_url)
    upgrade_to_head(engine)
    upgrade_to_head(engine)  # idempotent
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == [], f"models and migrations differ: add a revision ({diff})"
    assert {"tokens", "runs", "updates", "spans", "task_sets"} <= set(
        inspect(engine).get_table_names()
    )
    cfg = Config()
    cfg.set_main_option("script_location", str(ALEMBIC_DIR))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "base")
    assert "runs" not in inspect(engine).get_table_names()
    upgrade_to_head(engine)
    assert "runs" in inspect(engine).get_table_names()
    engine.dispose()
