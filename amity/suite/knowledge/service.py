"""What the knowledge routes share for the app's lifetime: where embeddings come from,
the chunk sizes, the index cache.

Embeddings come from all-MiniLM-L6-v2 (its package ships the model), served by
shared replicas the Suite starts itself, as it does the serverless catalog's models
(ServerlessReplicas): the first knowledge request that needs an embedding starts
one, and it stops after --serverless-cooldown-s without requests.
`--knowledge-embedding-url` names a container of the operator's instead.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import anyio.from_thread
from fastapi import Request
from sqlalchemy.orm import Session, sessionmaker

from amity.config import SuiteConfig
from amity.suite.knowledge.embedder import Embedder
from amity.suite.knowledge.ingest import ChunkSizes
from amity.suite.knowledge.search import IndexCache
from amity.suite.serverless.inference import lease


@dataclass(frozen=True)
class EmbeddingModel:
    """A shared model of the Suite's own, not in the serverless catalog (which lists
    chat models: the spec has no serverless embeddings)."""
    id: str
    source: str
    replicas: str


EMBEDDER = EmbeddingModel("sentence-transformers/all-MiniLM-L6-v2", "zip:all_minilm_l6_v2",
                          "scale-to-zero")


@dataclass
class Knowledge:
    fixed: Embedder | None  # --knowledge-embedding-url's container
    sizes: ChunkSizes
    cache: IndexCache

    @classmethod
    def from_config(cls, config: SuiteConfig, sessions: sessionmaker[Session]) -> "Knowledge":
        if not 0 <= config.knowledge_chunk_overlap_tokens < config.knowledge_chunk_tokens:
            raise ValueError("--knowledge-chunk-overlap-tokens must be at least 0 and less than "
                             "--knowledge-chunk-tokens")
        fixed = Embedder(config.knowledge_embedding_url) if config.knowledge_embedding_url else None
        return cls(fixed, ChunkSizes(config.knowledge_chunk_tokens,
                                     config.knowledge_chunk_overlap_tokens),
                   IndexCache(sessions, config.knowledge_hnsw_threshold))

    @contextmanager
    def embedder(self, request: Request) -> Iterator[Embedder]:
        """An embedder for one request of a sync route (a worker thread): a slot on a
        shared replica, held until the block ends. A replica that is starting, cannot
        start or is busy is the serverless routes' 503 or 429."""
        if self.fixed is not None:
            yield self.fixed
            return
        slot = anyio.from_thread.run(lease, request, EMBEDDER)
        embedder = Embedder(slot.url)
        try:
            yield embedder
        finally:
            embedder.close()
            anyio.from_thread.run_sync(slot.release)  # it wakes waiters on the event loop

    def close(self) -> None:
        if self.fixed is not None:
            self.fixed.close()
