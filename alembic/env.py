"""Alembic environment for the control-plane schema (one metadata: service.tables).

The service passes its own connection in `config.attributes["connection"]`; run by hand, the URL
comes from TSRL_DATABASE_URL (or the default SQLite file). SQLite gets batch mode so ALTERs work.
"""

from __future__ import annotations

import logging.config

from sqlalchemy import Connection

import thundersync.service.tables  # noqa: F401  (registers the tables on the metadata)
from alembic import context
from thundersync.service.db import Base, make_engine, migration_connection
from thundersync.service.settings import Settings

config = context.config
target_metadata = Base.metadata

if config.config_file_name is not None and config.attributes.get("connection") is None:
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=Settings.from_env().db_url,
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(Settings.from_env().db_url)
    with migration_connection(engine) as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
