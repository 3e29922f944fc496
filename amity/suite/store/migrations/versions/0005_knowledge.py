"""Knowledge bases, their documents and their embedded chunks.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _fk(target: str) -> sa.ForeignKey:
    return sa.ForeignKey(target, ondelete="CASCADE")


def upgrade() -> None:
    op.create_table(
        "knowledge_bases",
        sa.Column("pk", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        sa.Column("team_id", sa.String(64), _fk("teams.id"), nullable=False, index=True),
        sa.Column("creator_id", sa.String(64), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("embedding_model", sa.String(200), nullable=True),
        sa.Column("dimension", sa.Integer, nullable=True),
        sa.Column("revision", sa.Integer, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "knowledge_documents",
        sa.Column("pk", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("base_pk", sa.Integer, _fk("knowledge_bases.pk"), nullable=False, index=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("file_id", sa.String(64), nullable=True),
        sa.Column("chunk_count", sa.Integer, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("base_pk", "id"),
    )
    op.create_table(
        "knowledge_chunks",
        sa.Column("pk", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        sa.Column("base_pk", sa.Integer, _fk("knowledge_bases.pk"), nullable=False, index=True),
        sa.Column("document_pk", sa.Integer, _fk("knowledge_documents.pk"), nullable=False,
                  index=True),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("embedding", sa.LargeBinary, nullable=False),
    )
