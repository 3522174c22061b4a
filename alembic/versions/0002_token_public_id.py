"""tokens: a random public id replaces the stored prefix of the secret

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 10:00:00.000000

`tokens.prefix` kept the first 9 characters of every secret (all of a short admin token). It is
replaced by `public_id` (`tok_` + 8 random url-safe characters, unrelated to the secret); existing
rows get fresh random ids. Downgrading fills `prefix` with the public id, since the secrets are
not known: no part of a secret is written back.

On SQLite the second step rebuilds the table (batch mode), which needs foreign keys off (the
service's `migration_connection` does that) or `DROP TABLE tokens` would cascade to every run and
task set: the migration refuses to run in that case rather than lose rows.
"""

import secrets
from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOKENS = sa.table(
    "tokens",
    sa.column("id", sa.Uuid()),
    sa.column("prefix", sa.String(12)),
    sa.column("public_id", sa.String(12)),
)


def _refuse_cascading_rebuild() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "sqlite" or not bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        return
    owned = sum(
        bind.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar() or 0
        for table in ("runs", "task_sets")
    )
    if owned:
        raise RuntimeError(
            "SQLite foreign keys are on: rebuilding `tokens` would delete every run and task set. "
            "Migrate with `tsrl serve` (or alembic with this repository's env.py), which turns "
            "them off for the migration."
        )


def upgrade() -> None:
    _refuse_cascading_rebuild()
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("public_id", sa.String(length=12), nullable=True))
    bind = op.get_bind()
    used: set[str] = set()
    for (token_id,) in bind.execute(sa.select(TOKENS.c.id)).all():
        public_id = "tok_" + secrets.token_urlsafe(6)
        while public_id in used:
            public_id = "tok_" + secrets.token_urlsafe(6)
        used.add(public_id)
        bind.execute(TOKENS.update().where(TOKENS.c.id == token_id).values(public_id=public_id))
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.alter_column("public_id", existing_type=sa.String(length=12), nullable=False)
        batch_op.create_index(batch_op.f("ix_tokens_public_id"), ["public_id"], unique=True)
        batch_op.drop_column("prefix")


def downgrade() -> None:
    _refuse_cascading_rebuild()
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("prefix", sa.String(length=12), nullable=True))
    op.execute(TOKENS.update().values(prefix=TOKENS.c.public_id))
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.alter_column("prefix", existing_type=sa.String(length=12), nullable=False)
        batch_op.drop_index(batch_op.f("ix_tokens_public_id"))
        batch_op.drop_column("public_id")
