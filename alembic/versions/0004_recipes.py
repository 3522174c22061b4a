"""uploaded recipes

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 19:20:00.000000

- `recipes`: a token's uploaded recipe YAML (validated as a run config when uploaded), used by
  name in POST /runs.
"""

from collections.abc import Sequence

import sqlalchemy as sa

import thundersync.service.db
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "recipes",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("owner_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", thundersync.service.db.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["owner_id"], ["tokens.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("owner_id", "name", name="uq_recipes_owner_name"),
    )


def downgrade() -> None:
    op.drop_table("recipes")
