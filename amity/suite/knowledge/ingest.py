"""Adding documents to a knowledge base: each one's text, chunks and their vectors
first, then one transaction that stores them all (a request adds all its documents or
none). The slow part (embedding) runs outside any database transaction; the base is
looked up again before writing, in case it went meanwhile."""

from dataclasses import dataclass

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from amity.suite.auth import Caller
from amity.suite.knowledge import bases
from amity.suite.knowledge.chunking import chunk
from amity.suite.knowledge.embedder import Embedder
from amity.suite.knowledge.extract import document_text
from amity.suite.store.models import KnowledgeDocument


@dataclass(frozen=True)
class ChunkSizes:
    max_tokens: int
    overlap_tokens: int


@dataclass(frozen=True)
class Prepared:
    document_id: str
    name: str
    file_id: str | None
    chunks: list[str]
    vectors: np.ndarray


def prepare(embedder: Embedder, sizes: ChunkSizes, document_id: str, name: str, data: bytes,
            file_id: str | None = None) -> Prepared:
    text = document_text(name, data)
    pieces = chunk(text, sizes.max_tokens, sizes.overlap_tokens, embedder.count_tokens)
    return Prepared(document_id, name, file_id, pieces, embedder.embed(pieces))


def store(sessions: sessionmaker[Session], who: Caller, knowledge_id: str, model: str,
          prepared: list[Prepared]) -> list[KnowledgeDocument]:
    with sessions.begin() as session:
        base = bases.team_base(session, who, knowledge_id)
        return [bases.add_document(session, base, p.document_id, p.name, p.file_id, p.chunks,
                                   p.vectors, model) for p in prepared]
