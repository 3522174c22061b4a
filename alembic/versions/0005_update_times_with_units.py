"""update times named with their unit

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-04 03:00:00.000000

- `updates`: the columns `R` / `L` / `P` (rollout close, learner busy, barrier: seconds) become
  `rollout_s` / `learner_busy_s` / `barrier_s`, the names metrics.jsonl and the API use; values kept.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RENAMES = (("R", "rollout_s"), ("L", "learner_busy_s"), ("P", "barrier_s"))


def upgrade() -> None:
    with op.batch_alter_table("updates") as batch:
        for old, new in RENAMES:
            batch.alter_column(old, new_column_name=new)


def downgrade() -> None:
    with op.batch_alter_table("updates") as batch:
        for old, new in RENAMES:
            batch.alter_column(new, new_column_name=old)
