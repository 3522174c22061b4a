"""Engine, sessions and migrations on one SQLAlchemy metadata (SQLite default, PostgreSQL by URL).

The schema is owned by Alembic (alembic/ at the repository root); the service upgrades to head on
start, so a fresh data directory and an old database both come up on the current schema.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, DateTime, Engine, create_engine, event
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
from sqlalchemy.types import TypeDecorator

ALEMBIC_DIR = (
    Path(__file__).parent / "migrations"
)  # package data (a link to ../alembic in a checkout)


class Base(DeclarativeBase):
    pass


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite drops the zone; we put it back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    with factory() as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


@contextmanager
def migration_connection(engine: Engine) -> Iterator[Connection]:
    """A connection in a transaction for Alembic. On SQLite, foreign keys are off while it runs:
    a batch migration rebuilds a table (copy, DROP, rename), and with foreign keys on, dropping
    `tokens` would cascade-delete every run and task set. SQLite ignores the pragma inside a
    transaction, so it is set first; the rows are checked before the commit (SQLite's own
    procedure for schema changes), and foreign keys are back on afterwards."""
    with engine.connect() as conn:
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.commit()
        try:
            with conn.begin():
                yield conn
                if sqlite:
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if broken:
                        raise RuntimeError(f"migration left dangling foreign keys: {broken[:5]}")
        finally:
            if sqlite:
                conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                conn.commit()


def upgrade_to_head(engine: Engine) -> None:
    """Apply every Alembic migration on `engine` (idempotent)."""
    from alembic.config import Config

    from alembic import command

    if not (ALEMBIC_DIR / "env.py").exists():
        raise RuntimeError(
            f"migrations not found at {ALEMBIC_DIR}: the thundersync package ships them as "
            "package data (service/migrations); reinstall it (pip install thundersync or -e .)"
        )
    cfg = Config()
    cfg.set_main_option("script_location", str(ALEMBIC_DIR))
    with migration_connection(engine) as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
