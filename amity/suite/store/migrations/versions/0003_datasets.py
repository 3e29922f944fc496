"""Datasets: working-copy splits and samples, and versions as copied snapshots.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _pk() -> sa.Column:
    return sa.Column("pk", sa.Integer, primary_key=True, autoincrement=True)


def _parent(column: str, target: str, type_=sa.Integer) -> sa.Column:
    return sa.Column(column, type_, sa.ForeignKey(target, ondelete="CASCADE"), nullable=False,
                     index=True)


def _times() -> list[sa.Column]:
    return [sa.Column("created_at", sa.BigInteger, nullable=False),
            sa.Column("updated_at", sa.BigInteger, nullable=False)]


def upgrade() -> None:
    op.create_table(
        "datasets", _pk(),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        _parent("project_id", "projects.id", sa.String(64)),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("modality", sa.JSON, nullable=False),
        *_times(),
    )
    op.create_table(
        "splits", _pk(),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        _parent("dataset_pk", "datasets.pk"),
        sa.Column("name", sa.String(200), nullable=False),
        *_times(),
        sa.UniqueConstraint("dataset_pk", "name"),
    )
    op.create_table(
        "samples",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        _parent("split_pk", "splits.pk"),
        sa.Column("data", sa.Text, nullable=False),
    )
    op.create_table(
        "versions", _pk(),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        _parent("dataset_pk", "datasets.pk"),
        sa.Column("comment", sa.Text, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "version_splits", _pk(),
        _parent("version_pk", "versions.pk"),
        sa.Column("split_id", sa.String(64), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        *_times(),
    )
    op.create_table(
        "version_samples", _pk(),
        _parent("version_split_pk", "version_splits.pk"),
        sa.Column("sample_id", sa.Integer, nullable=False),
        sa.Column("data", sa.Text, nullable=False),
    )
