"""Alembic's environment: runs on the connection `studyapp.migrate` hands it (the app's own
engine), so no alembic.ini or URL is needed at run time."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

from studyapp import models  # noqa: F401 - registers the tables, for autogenerate's comparison

config = context.config
connection = config.attributes["connection"]

context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    # SQLite cannot ALTER most things: batch mode copies the table when it must.
    render_as_batch=True,
    compare_type=True,
    transaction_per_migration=True,
)
with context.begin_transaction():
    context.run_migrations()
