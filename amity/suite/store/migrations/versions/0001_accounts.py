"""Accounts: teams, users, memberships, projects, hashed tokens, settings.

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

ID = sa.String(64)


def _fk(column: str, target: str, **kw) -> sa.Column:
    return sa.Column(column, ID, sa.ForeignKey(target, ondelete="CASCADE"), nullable=False, **kw)


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", ID, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "users",
        sa.Column("id", ID, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("default_team_id", ID, sa.ForeignKey("teams.id"), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "memberships",
        _fk("user_id", "users.id", primary_key=True),
        _fk("team_id", "teams.id", primary_key=True),
    )
    op.create_table(
        "projects",
        sa.Column("id", ID, primary_key=True),
        _fk("team_id", "teams.id", index=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "tokens",
        sa.Column("id", ID, primary_key=True),
        _fk("user_id", "users.id", index=True),
        sa.Column("sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "settings",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
