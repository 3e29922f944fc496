"""What the knowledge routes share for the app's lifetime: the embedder (None when no
`--knowledge-embedding-url` is given), the chunk sizes, the index cache."""

from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from amity.config import SuiteConfig
from amity.suite.errors import ApiError
from amity.suite.knowledge.embedder import Embedder
from amity.suite.knowledge.ingest import ChunkSizes
from amity.suite.knowledge.search import IndexCache


@dataclass
class Knowledge:
    embedder: Embedder | None
    sizes: ChunkSizes
    cache: IndexCache

    @classmethod
    def from_config(cls, config: SuiteConfig, sessions: sessionmaker[Session]) -> "Knowledge":
        if not 0 <= config.knowledge_chunk_overlap_tokens < config.knowledge_chunk_tokens:
            raise ValueError("--knowledge-chunk-overlap-tokens must be at least 0 and less than "
                             "--knowledge-chunk-tokens")
        embedder = Embedder(config.knowledge_embedding_url) if config.knowledge_embedding_url else None
        return cls(embedder, ChunkSizes(config.knowledge_chunk_tokens,
                                        config.knowledge_chunk_overlap_tokens),
                   IndexCache(sessions, config.knowledge_hnsw_threshold))

    def require_embedder(self) -> Embedder:
        if self.embedder is None:
            raise ApiError(503, "knowledge bases need an embedding container: start one "
                                "(`amity serve --model DIR_OF_all-MiniLM-L6-v2`) and give its "
                                "URL to `amity suite --knowledge-embedding-url`",
                           loc=(), type="no_embedder")
        return self.embedder

    def close(self) -> None:
        if self.embedder is not None:
            self.embedder.close()
