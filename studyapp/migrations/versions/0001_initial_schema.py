"""The schema as the app created it before migrations (SQLModel's create_all).

A database made before Alembic has exactly these tables and is stamped at this revision.
Types are spelled as plain SQLAlchemy types that emit the same DDL as the models' types
(AutoString is VARCHAR, UTCDateTime is DATETIME / TIMESTAMP WITH TIME ZONE), so this file
never changes when the models do.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "deck",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("title", sa.String(), nullable=False),
        sa.Column("description", sa.String(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("retired", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "labrun",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("lab_id", sa.String(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sa.String(), nullable=True),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("started_at", UTC_DATETIME, nullable=True),
        sa.Column("finished_at", UTC_DATETIME, nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_labrun_lab_id", "labrun", ["lab_id"], unique=False)
    op.create_table(
        "card",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("question_id", sa.String(), nullable=False),
        sa.Column("deck_id", sa.String(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("prompt", sa.String(), nullable=False),
        sa.Column("choices", sa.JSON(), nullable=False),
        sa.Column("answer", sa.Integer(), nullable=False),
        sa.Column("explanation", sa.String(), nullable=False),
        sa.Column("why_wrong", sa.JSON(), nullable=False),
        sa.Column("lab", sa.String(), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("content_hash", sa.String(), nullable=False),
        sa.Column("retired", sa.Boolean(), nullable=False),
        sa.Column("repetitions", sa.Integer(), nullable=False),
        sa.Column("easiness", sa.Float(), nullable=False),
        sa.Column("interval", sa.Integer(), nullable=False),
        sa.Column("due_day", sa.Date(), nullable=True),
        sa.Column("repeat_day", sa.Date(), nullable=True),
        sa.Column("last_reviewed_at", UTC_DATETIME, nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["deck_id"], ["deck.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_card_deck_next_due", "card", ["deck_id", "retired", "due_day", "position"], unique=False)
    op.create_index("ix_card_next_due", "card", ["retired", "due_day", "position"], unique=False)
    op.create_index("ix_card_question_id", "card", ["question_id"], unique=True)
    op.create_index("ix_card_repeat", "card", ["repeat_day", "last_reviewed_at"], unique=False)
    op.create_table(
        "reviewlog",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("card_id", sa.Integer(), nullable=False),
        sa.Column("submission_id", sa.String(), nullable=False),
        sa.Column("reviewed_at", UTC_DATETIME, nullable=False),
        sa.Column("study_day", sa.Date(), nullable=False),
        sa.Column("quality", sa.Integer(), nullable=False),
        sa.Column("choice", sa.Integer(), nullable=False),
        sa.Column("correct", sa.Boolean(), nullable=False),
        sa.Column("is_repeat", sa.Boolean(), nullable=False),
        sa.Column("was_new", sa.Boolean(), nullable=False),
        sa.Column("before_repetitions", sa.Integer(), nullable=False),
        sa.Column("before_easiness", sa.Float(), nullable=False),
        sa.Column("before_interval", sa.Integer(), nullable=False),
        sa.Column("before_due_day", sa.Date(), nullable=True),
        sa.Column("before_repeat_day", sa.Date(), nullable=True),
        sa.Column("before_last_reviewed_at", UTC_DATETIME, nullable=True),
        sa.Column("after_repetitions", sa.Integer(), nullable=False),
        sa.Column("after_easiness", sa.Float(), nullable=False),
        sa.Column("after_interval", sa.Integer(), nullable=False),
        sa.Column("after_due_day", sa.Date(), nullable=True),
        sa.Column("after_repeat_day", sa.Date(), nullable=True),
        sa.Column("undone_at", UTC_DATETIME, nullable=True),
        sa.ForeignKeyConstraint(["card_id"], ["card.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("submission_id"),
    )
    op.create_index("ix_reviewlog_card_id", "reviewlog", ["card_id"], unique=False)
    op.create_index("ix_reviewlog_day", "reviewlog", ["study_day", "undone_at"], unique=False)


def downgrade() -> None:
    op.drop_table("reviewlog")
    op.drop_table("card")
    op.drop_table("labrun")
    op.drop_table("deck")
