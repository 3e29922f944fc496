"""Retrieve: embed the query, search the base's index, return the chunks best first.

Indexes are built from the database on first use and kept in memory, keyed by the
base's `revision`: any change to the base (a document added or deleted) makes the next
search rebuild it. Every Suite process sharing a database does the same, so none of
them serves a stale base.
"""

import threading
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from amity.suite.auth import Caller
from amity.suite.knowledge import bases
from amity.suite.knowledge.embedder import Embedder
from amity.suite.knowledge.index import VectorIndex

CACHED_BASES = 16


@dataclass(frozen=True)
class Hit:
    text: str
    score: float
    chunk_id: str
    document_id: str


class IndexCache:
    def __init__(self, sessions: sessionmaker[Session], hnsw_threshold: int):
        self.sessions, self.hnsw_threshold = sessions, hnsw_threshold
        self.entries: OrderedDict[int, tuple[int, VectorIndex]] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, base_pk: int, revision: int, dimension: int) -> VectorIndex:
        with self.lock:
            cached = self.entries.get(base_pk)
            if cached is not None and cached[0] == revision:
                self.entries.move_to_end(base_pk)
                return cached[1]
            # Built under the lock: concurrent first searches of a base build it once.
            with self.sessions() as session:
                keys, rows = bases.vectors(session, base_pk, dimension)
            index = VectorIndex.build(keys, rows, self.hnsw_threshold)
            self.entries[base_pk] = (revision, index)
            self.entries.move_to_end(base_pk)
            while len(self.entries) > CACHED_BASES:
                self.entries.popitem(last=False)
            return index


def retrieve(sessions: sessionmaker[Session],
             embedding: Callable[[], AbstractContextManager[Embedder]],
             cache: IndexCache, who: Caller, knowledge_id: str, query: str, k: int) -> list[Hit]:
    """The request's own faults (an unknown base) are told before the Suite's (the
    embedder failing); an empty base needs no embedder."""
    loc = ("body", "knowledgeIds", 0)
    with sessions() as session:
        base = bases.team_base(session, who, knowledge_id, loc)
    if base.dimension is None:  # no document yet
        return []
    with embedding() as embedder:
        bases.check_embedder(base, embedder.model, loc)
        query_vector = embedder.embed([query])[0]
    found = cache.get(base.pk, base.revision, base.dimension).search(query_vector, k)
    with sessions() as session:
        by_pk = bases.chunks(session, [pk for pk, _ in found])
    # A chunk deleted since the index was read is left out.
    return [Hit(by_pk[pk][0].text, score, by_pk[pk][0].id, by_pk[pk][1])
            for pk, score in found if pk in by_pk]
