"""reviewlog.duration_ms: how long the learner took to answer (FSRS's review duration).

Nullable: reviews logged before this revision (and imports without it) have no duration.
On SQLite, batch mode adds the column in place (ADD COLUMN needs no table copy).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("reviewlog") as batch_op:
        batch_op.add_column(sa.Column("duration_ms", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reviewlog") as batch_op:
        batch_op.drop_column("duration_ms")
