"""The Suite's tables. The Alembic migrations in `migrations/versions/` build exactly
these (a test compares the two), so a change here comes with a new migration.

Public ids are short random strings with a type prefix (`team_...`, `ds_...`); they
never contain `:`, which separates the parts of a full sample id. Datasets, splits and
versions also have an integer `pk` that orders lists and keys the cursors.
"""

import secrets
import time
from datetime import datetime

from sqlalchemy import (JSON, BigInteger, DateTime, ForeignKey, Integer, LargeBinary, String, Text,
                        UniqueConstraint)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def now_s() -> int:
    return int(time.time())


class Base(DeclarativeBase):
    pass


def _fk(target: str) -> ForeignKey:
    return ForeignKey(target, ondelete="CASCADE")


class Team(Base):
    __tablename__ = "teams"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[int] = mapped_column(BigInteger)


class User(Base):
    __tablename__ = "users"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    default_team_id: Mapped[str] = mapped_column(String(64), ForeignKey("teams.id"))
    created_at: Mapped[int] = mapped_column(BigInteger)


class Membership(Base):
    __tablename__ = "memberships"
    user_id: Mapped[str] = mapped_column(String(64), _fk("users.id"), primary_key=True)
    team_id: Mapped[str] = mapped_column(String(64), _fk("teams.id"), primary_key=True)


class Project(Base):
    __tablename__ = "projects"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    team_id: Mapped[str] = mapped_column(String(64), _fk("teams.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[int] = mapped_column(BigInteger)


class Token(Base):
    """Only the sha256 of a token is kept: the token itself is shown once, at creation."""

    __tablename__ = "tokens"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(64), _fk("users.id"), index=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[int] = mapped_column(BigInteger)


class Setting(Base):
    """Process-wide values that must survive restarts and be shared by every Suite
    process on the same database (the URL-signing key)."""

    __tablename__ = "settings"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class File(Base):
    __tablename__ = "files"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    project_id: Mapped[str] = mapped_column(String(64), _fk("projects.id"), index=True)
    creator_id: Mapped[str] = mapped_column(String(64), ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(BigInteger)
    digest: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16))
    # The object store key, always ours (`<project>/<file id>`): the name never reaches it.
    object_key: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Dataset(Base):
    __tablename__ = "datasets"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    project_id: Mapped[str] = mapped_column(String(64), _fk("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    modality: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)


class Split(Base):
    """A split of a dataset's working copy."""

    __tablename__ = "splits"
    __table_args__ = (UniqueConstraint("dataset_pk", "name"),)
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    dataset_pk: Mapped[int] = mapped_column(Integer, _fk("datasets.pk"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)


class Sample(Base):
    """A sample of a working-copy split; `id` is the bare sample id."""

    __tablename__ = "samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    split_pk: Mapped[int] = mapped_column(Integer, _fk("splits.pk"), index=True)
    data: Mapped[str] = mapped_column(Text)


class Version(Base):
    __tablename__ = "versions"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    dataset_pk: Mapped[int] = mapped_column(Integer, _fk("datasets.pk"), index=True)
    comment: Mapped[str] = mapped_column(Text)
    created_at: Mapped[int] = mapped_column(BigInteger)


class VersionSplit(Base):
    """A split as it was when its version was made (rows are copied: a version never
    changes, whatever later happens to the working copy)."""

    __tablename__ = "version_splits"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version_pk: Mapped[int] = mapped_column(Integer, _fk("versions.pk"), index=True)
    split_id: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)


class VersionSample(Base):
    __tablename__ = "version_samples"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    version_split_pk: Mapped[int] = mapped_column(Integer, _fk("version_splits.pk"), index=True)
    sample_id: Mapped[int] = mapped_column(Integer)
    data: Mapped[str] = mapped_column(Text)


class Endpoint(Base):
    """A dedicated endpoint: its current configuration (`config`, the normalised
    create/update body), where it is (`status`, `phase`, `error_code`) and where the
    Suite should bring it back to after a restart (`desired`: running, sleeping,
    terminated)."""

    __tablename__ = "endpoints"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    team_id: Mapped[str] = mapped_column(String(64), _fk("teams.id"), index=True)
    project_id: Mapped[str] = mapped_column(String(64), _fk("projects.id"), index=True)
    creator_id: Mapped[str] = mapped_column(String(64), ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(32))
    phase: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(64), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    desired: Mapped[str] = mapped_column(String(16))
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True, index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class EndpointVersion(Base):
    """One entry of an endpoint's version history: the configuration it had."""

    __tablename__ = "endpoint_versions"
    __table_args__ = (UniqueConstraint("endpoint_pk", "number"),)
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    endpoint_pk: Mapped[int] = mapped_column(Integer, _fk("endpoints.pk"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict] = mapped_column(JSON)
    comment: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class KnowledgeBase(Base):
    """A team's knowledge base. `embedding_model` and `dimension` are set by its first
    document (every vector of a base comes from the same embedder); `revision` grows
    with every change, so a cached search index knows when it is stale."""

    __tablename__ = "knowledge_bases"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    team_id: Mapped[str] = mapped_column(String(64), _fk("teams.id"), index=True)
    creator_id: Mapped[str] = mapped_column(String(64), ForeignKey("users.id"))
    name: Mapped[str] = mapped_column(String(200))
    embedding_model: Mapped[str | None] = mapped_column(String(200), nullable=True)
    dimension: Mapped[int | None] = mapped_column(Integer, nullable=True)
    revision: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[int] = mapped_column(BigInteger)


class KnowledgeDocument(Base):
    """A document of a base: its `id` is retrieve's `contentId` (the Files API id when
    it came from the Files store, `doc_...` when uploaded directly)."""

    __tablename__ = "knowledge_documents"
    __table_args__ = (UniqueConstraint("base_pk", "id"),)
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64))
    base_pk: Mapped[int] = mapped_column(Integer, _fk("knowledge_bases.pk"), index=True)
    name: Mapped[str] = mapped_column(Text)
    file_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    chunk_count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[int] = mapped_column(BigInteger)


class KnowledgeChunk(Base):
    """A chunk of a document with its unit-length embedding, little-endian float32
    bytes (`dimension` of them per chunk). `id` is retrieve's `contentChunkId`."""

    __tablename__ = "knowledge_chunks"
    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    base_pk: Mapped[int] = mapped_column(Integer, _fk("knowledge_bases.pk"), index=True)
    document_pk: Mapped[int] = mapped_column(Integer, _fk("knowledge_documents.pk"), index=True)
    position: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    embedding: Mapped[bytes] = mapped_column(LargeBinary)
