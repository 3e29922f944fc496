"""The Suite's state: SQLAlchemy models and the Alembic migrations that build them."""
