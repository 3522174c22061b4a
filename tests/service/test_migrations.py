"""Alembic owns the schema: upgrade from empty, the models match the migrations (no pending
autogenerate diff), and downgrade/upgrade round-trips on both databases; 0002 moves existing
tokens from a stored piece of their secret to a random public id without losing any row; 0005
renames the update times and keeps their values."""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import (
    JSON,
    Boolean,
    Connection,
    Engine,
    Float,
    Integer,
    String,
    Uuid,
    column,
    inspect,
    table,
    text,
)

import thundersync.service.tables  # noqa: F401
from alembic import command
from thundersync.service.db import (
    ALEMBIC_DIR,
    Base,
    UTCDateTime,
    make_engine,
    migration_connection,
    upgrade_to_head,
)


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


# --- 0002: tokens.prefix (9 characters of the secret) -> tokens.public_id (random) ----------------

SECRETS = {"alice": "tsrl_~a!b~c!d~e!f~g!h~", "admin": "Q~x!k7"}  # every 4-char window has ~ or !


def _cfg(conn: Connection) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(ALEMBIC_DIR))
    cfg.attributes["connection"] = conn
    return cfg


def _cols(table_name: str, /, **types: Any) -> Any:
    return table(table_name, *(column(k, t) for k, t in types.items()))


def _seed_0001(engine: Engine) -> uuid.UUID:
    """A database on the first schema as its service left it: tokens whose `prefix` holds the
    first 9 characters of their secret, and a run and a task set owned by one of them."""
    now = datetime.now(UTC)
    tokens = _cols(
        "tokens",
        id=Uuid(),
        name=String(),
        token_hash=String(),
        prefix=String(),
        is_admin=Boolean(),
        created_at=UTCDateTime(),
    )
    runs = _cols(
        "runs",
        id=Uuid(),
        owner_id=Uuid(),
        name=String(),
        objective=String(),
        schedule=String(),
        config=JSON(),
        status=String(),
        reason=String(),
        backend=String(),
        run_dir=String(),
        metrics_offset=Integer(),
        spans_offset=Integer(),
        updates_done=Integer(),
        created_at=UTCDateTime(),
    )
    task_sets = _cols(
        "task_sets",
        id=Uuid(),
        owner_id=Uuid(),
        name=String(),
        kind=String(),
        source=String(),
        description=String(),
        meta=JSON(),
        created_at=UTCDateTime(),
    )
    owner = uuid.uuid4()
    with engine.begin() as conn:
        command.upgrade(_cfg(conn), "0001")
        for name, secret in SECRETS.items():
            conn.execute(
                tokens.insert().values(
                    id=owner if name == "alice" else uuid.uuid4(),
                    name=name,
                    token_hash=hashlib.sha256(secret.encode()).hexdigest(),
                    prefix=secret[:9],
                    is_admin=name == "admin",
                    created_at=now,
                )
            )
        conn.execute(
            runs.insert().values(
                id=uuid.uuid4(),
                owner_id=owner,
                name="r",
                objective="grpo",
                schedule="sync",
                config={},
                status="succeeded",
                reason="",
                backend="embedded",
                run_dir="",
                metrics_offset=0,
                spans_offset=0,
                updates_done=0,
                created_at=now,
            )
        )
        conn.execute(
            task_sets.insert().values(
                id=uuid.uuid4(),
                owner_id=owner,
                name="ts",
                kind="seta",
                source="s",
                description="",
                meta={},
                created_at=now,
            )
        )
    return owner


def _token_rows(engine: Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text("SELECT * FROM tokens"))]


def _count(engine: Engine, name: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM {name}")).scalar_one())


def test_0002_replaces_secret_prefixes_with_random_public_ids(database_url: str) -> None:
    engine = make_engine(database_url)
    _seed_0001(engine)
    if engine.dialect.name == "sqlite":
        # migrating with SQLite foreign keys on would cascade the table rebuild to every run
        with pytest.raises(RuntimeError, match="would delete every run"), engine.begin() as conn:
            command.upgrade(_cfg(conn), "head")
    upgrade_to_head(engine)
    rows = _token_rows(engine)
    assert len(rows) == 2 and all("prefix" not in r for r in rows)
    assert all(re.fullmatch(r"tok_[A-Za-z0-9_-]{8}", r["public_id"]) for r in rows), rows
    assert len({r["public_id"] for r in rows}) == 2
    dump = repr(rows)
    pieces = {s[i : i + 4] for s in SECRETS.values() for i in range(len(s) - 3)}
    assert [p for p in pieces if p in dump] == []
    # no run or task set was lost, and the admin token still works
    assert _count(engine, "runs") == 1 and _count(engine, "task_sets") == 1
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
        if engine.dialect.name == "sqlite":
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    with migration_connection(engine) as conn:
        command.downgrade(_cfg(conn), "0001")
    rows_back = _token_rows(engine)
    assert sorted(r["prefix"] for r in rows_back) == sorted(r["public_id"] for r in rows)
    assert _count(engine, "runs") == 1 and _count(engine, "task_sets") == 1
    engine.dispose()


# --- 0005: updates.R / L / P -> rollout_s / learner_busy_s / barrier_s ----------------------------

TIMES = {"R": 3.0, "L": 2.5, "P": 0.4}
RENAMED = {"R": "rollout_s", "L": "learner_busy_s", "P": "barrier_s"}


def _update_times(engine: Engine, names: list[str]) -> list[float]:
    cols = ", ".join(f'"{n}"' for n in names)
    with engine.connect() as conn:
        return list(conn.execute(text(f"SELECT {cols} FROM updates")).one())


def test_0005_names_the_update_times_with_their_unit_and_keeps_the_values(
    database_url: str,
) -> None:
    engine = make_engine(database_url)
    _seed_0001(engine)
    with engine.connect() as conn:
        run_id = conn.execute(text("SELECT id FROM runs")).scalar_one()
    updates = _cols(
        "updates",
        run_id=Uuid(),
        update=Integer(),
        schedule=String(),
        time=Float(),
        step_s=Float(),
        **dict.fromkeys(TIMES, Float()),
        idle_share=Float(),
        mfu=Float(),
        reward_mean=Float(),
        tokens=Integer(),
        extra=JSON(),
    )
    with migration_connection(engine) as conn:
        command.upgrade(_cfg(conn), "0004")
        conn.execute(
            updates.insert().values(
                run_id=run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id)),
                update=0,
                schedule="sync",
                time=1.0,
                step_s=6.0,
                **TIMES,
                idle_share=0.0,
                mfu=0.0,
                reward_mean=0.0,
                tokens=0,
                extra={},
            )
        )
    upgrade_to_head(engine)
    assert _update_times(engine, list(RENAMED.values())) == list(TIMES.values())
    assert not set(TIMES) & {c["name"] for c in inspect(engine).get_columns("updates")}
    with migration_connection(engine) as conn:
        command.downgrade(_cfg(conn), "0004")
    assert _update_times(engine, list(TIMES)) == list(TIMES.values())
    engine.dispose()
