"""Alembic's entry point: runs on the connection `database.upgrade` hands over."""

from alembic import context

from amity.suite.store.models import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
