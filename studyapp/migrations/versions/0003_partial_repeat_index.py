"""ix_card_repeat holds only cards with a step-7 repeat (repeat_day set).

The index serves one lookup, "today's repeats, oldest first" (repeat_day = today), and a card
without a repeat never matches it. As a full index it took an entry for every card, and every
grade moved that card's entry (its last_reviewed_at changes): a delete and an insert in the index
within the grade's durable write. Partial, a grade touches it only when the card enters or leaves a
repeat.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

WITH_A_REPEAT = sa.text("repeat_day IS NOT NULL")


def upgrade() -> None:
    op.drop_index("ix_card_repeat", table_name="card")
    op.create_index(
        "ix_card_repeat", "card", ["repeat_day", "last_reviewed_at"], unique=False,
        sqlite_where=WITH_A_REPEAT, postgresql_where=WITH_A_REPEAT,
    )


def downgrade() -> None:
    op.drop_index("ix_card_repeat", table_name="card")
    op.create_index("ix_card_repeat", "card", ["repeat_day", "last_reviewed_at"], unique=False)
