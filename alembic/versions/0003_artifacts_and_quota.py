"""artifacts instead of host paths, a run quota per token, 64-bit file offsets

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03 10:00:00.000000

- `models`: model artifacts (a host path an admin registered, or files uploaded into the data dir).
- `task_sets.origin` (host | upload | uri) and `task_sets.shared`. Rows from before this revision
  were registered by any token with any host path: an admin's keep `host`; every other one becomes
  `uri` (recorded, never read), so no user's old registration still points the server at a path.
- `tokens.max_active_runs`: the token's own quota of concurrent runs (NULL: the service default).
- `runs.metrics_offset` / `runs.spans_offset` become BIGINT on PostgreSQL (byte offsets past 2 GiB);
  SQLite's INTEGER is 64-bit already.

Only columns are added (SQLite's ADD COLUMN / DROP COLUMN, no table rebuild), so no foreign key
cascades on either database.
"""

from collections.abc import Sequence

import sqlalchemy as sa

import thundersync.service.db
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OFFSETS = ("metrics_offset", "spans_offset")


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("owner_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("origin", sa.String(length=20), nullable=False),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("shared", sa.Boolean(), nullable=False),
        sa.Column("created_at", thundersync.service.db.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["owner_id"], ["tokens.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("owner_id", "name", name="uq_models_owner_name"),
    )
    op.add_column(
        "task_sets",
        sa.Column("origin", sa.String(length=20), nullable=False, server_default="host"),
    )
    op.add_column(
        "task_sets",
        sa.Column("shared", sa.Boolean(), nullable=False, server_default=sa.false()),
    )
    op.execute(
        "UPDATE task_sets SET origin = 'uri' WHERE owner_id NOT IN "
        "(SELECT id FROM tokens WHERE is_admin = true)"
    )
    op.add_column("tokens", sa.Column("max_active_runs", sa.Integer(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        for name in OFFSETS:
            op.alter_column(
                "runs",
                name,
                type_=sa.BigInteger(),
                existing_type=sa.Integer(),
                existing_nullable=False,
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for name in OFFSETS:
            op.alter_column(
                "runs",
                name,
                type_=sa.Integer(),
                existing_type=sa.BigInteger(),
                existing_nullable=False,
            )
    op.drop_column("tokens", "max_active_runs")
    op.drop_column("task_sets", "shared")
    op.drop_column("task_sets", "origin")
    op.drop_table("models")
