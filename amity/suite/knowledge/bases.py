"""Knowledge bases, documents and chunks in the Suite's database, always scoped to the
caller's team (another team's base is simply not found)."""

import numpy as np
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from amity.suite.auth import Caller
from amity.suite.errors import ApiError, not_found
from amity.suite.store.models import KnowledgeBase, KnowledgeChunk, KnowledgeDocument, new_id, now_s


def team_base(session: Session, who: Caller, knowledge_id: str,
              loc=("path", "knowledge_id")) -> KnowledgeBase:
    base = session.scalar(select(KnowledgeBase).where(KnowledgeBase.id == knowledge_id,
                                                      KnowledgeBase.team_id == who.team_id))
    if base is None:
        raise not_found("knowledge base", knowledge_id, loc)
    return base


def create_base(session: Session, who: Caller, name: str) -> KnowledgeBase:
    base = KnowledgeBase(id=new_id("kb"), team_id=who.team_id, creator_id=who.user_id, name=name,
                         revision=0, created_at=now_s())
    session.add(base)
    session.flush()
    return base


def counts(session: Session, base: KnowledgeBase) -> tuple[int, int]:
    """(documents, chunks) of a base."""
    documents, chunks = session.execute(
        select(func.count(), func.coalesce(func.sum(KnowledgeDocument.chunk_count), 0))
        .where(KnowledgeDocument.base_pk == base.pk)).one()
    return documents, int(chunks)


def team_bases(session: Session, who: Caller) -> list[KnowledgeBase]:
    return list(session.scalars(select(KnowledgeBase).where(KnowledgeBase.team_id == who.team_id)
                                .order_by(KnowledgeBase.pk)))


def documents(session: Session, base: KnowledgeBase) -> list[KnowledgeDocument]:
    return list(session.scalars(select(KnowledgeDocument).where(KnowledgeDocument.base_pk == base.pk)
                                .order_by(KnowledgeDocument.pk)))


def _bump(session: Session, base: KnowledgeBase) -> None:
    # In SQL, so that two writers each count.
    session.execute(update(KnowledgeBase).where(KnowledgeBase.pk == base.pk)
                    .values(revision=KnowledgeBase.revision + 1))


def check_embedder(base: KnowledgeBase, model: str, loc=("body",)) -> None:
    if base.embedding_model is not None and base.embedding_model != model:
        raise ApiError(409, f"the knowledge base {base.id} was embedded with "
                            f"{base.embedding_model!r}, but the embedding container serves "
                            f"{model!r}: serve that model again, or build a new base",
                       loc=loc, type="embedder_mismatch")


def document_exists(session: Session, base: KnowledgeBase, document_id: str) -> bool:
    return session.scalar(select(KnowledgeDocument.pk).where(
        KnowledgeDocument.base_pk == base.pk, KnowledgeDocument.id == document_id)) is not None


def add_document(session: Session, base: KnowledgeBase, document_id: str, name: str,
                 file_id: str | None, chunks: list[str], vectors: np.ndarray,
                 model: str) -> KnowledgeDocument:
    check_embedder(base, model)
    if document_exists(session, base, document_id):
        raise ApiError(409, f"the file {document_id} is in the knowledge base already",
                       loc=("body", "fileIds"), type="conflict")
    base.embedding_model, base.dimension = model, int(vectors.shape[1])
    document = KnowledgeDocument(id=document_id, base_pk=base.pk, name=name, file_id=file_id,
                                 chunk_count=len(chunks), created_at=now_s())
    session.add(document)
    session.flush()
    session.add_all(KnowledgeChunk(id=new_id("chunk"), base_pk=base.pk, document_pk=document.pk,
                                   position=i, text=text, embedding=vector.astype("<f4").tobytes())
                    for i, (text, vector) in enumerate(zip(chunks, vectors, strict=True)))
    _bump(session, base)
    return document


def delete_document(session: Session, base: KnowledgeBase, document_id: str) -> None:
    document = session.scalar(select(KnowledgeDocument).where(
        KnowledgeDocument.base_pk == base.pk, KnowledgeDocument.id == document_id))
    if document is None:
        raise not_found("document", document_id, ("path", "document_id"))
    session.delete(document)  # its chunks go with it (ON DELETE CASCADE)
    session.flush()
    if counts(session, base)[0] == 0:  # an empty base may take another embedder's vectors
        base.embedding_model = base.dimension = None
    _bump(session, base)


def vectors(session: Session, base_pk: int, dimension: int) -> tuple[np.ndarray, np.ndarray]:
    """(chunk pks, their vectors as rows) of a base."""
    rows = session.execute(select(KnowledgeChunk.pk, KnowledgeChunk.embedding)
                           .where(KnowledgeChunk.base_pk == base_pk)
                           .order_by(KnowledgeChunk.pk)).all()
    keys = np.fromiter((pk for pk, _ in rows), dtype=np.int64, count=len(rows))
    matrix = np.frombuffer(b"".join(blob for _, blob in rows), dtype="<f4")
    return keys, matrix.reshape(len(rows), dimension)


def chunks(session: Session, pks: list[int]) -> dict[int, tuple[KnowledgeChunk, str]]:
    """Chunks by pk, each with its document's id."""
    rows = session.execute(select(KnowledgeChunk, KnowledgeDocument.id)
                           .join(KnowledgeDocument, KnowledgeChunk.document_pk == KnowledgeDocument.pk)
                           .where(KnowledgeChunk.pk.in_(pks))).all()
    return {chunk.pk: (chunk, document_id) for chunk, document_id in rows}
