"""Nearest chunks of a knowledge base by cosine similarity.

Vectors are unit length, so the cosine is a dot product. Below the HNSW threshold a
search is exact (one matrix-vector product). From it, an HNSW graph (usearch) finds
candidates and the stored vectors score them exactly: the scores are always exact
cosines, only which chunks come back can differ from an exact search.
"""

from dataclasses import dataclass, field

import numpy as np

# HNSW parameters: graph degree, and candidate-list sizes while building and searching
# (recall vs exact is measured in tests/suite/knowledge/test_index.py).
CONNECTIVITY = 16
EXPANSION_ADD = 128
EXPANSION_SEARCH = 128
CANDIDATES_FACTOR = 2  # candidates fetched per result wanted, before exact rescoring


@dataclass
class VectorIndex:
    keys: np.ndarray  # int64, one per row
    vectors: np.ndarray  # float32 (rows, dimension), unit length
    hnsw: object | None = field(default=None, repr=False)  # usearch.index.Index

    @classmethod
    def build(cls, keys: np.ndarray, vectors: np.ndarray, hnsw_threshold: int) -> "VectorIndex":
        index = cls(keys.astype(np.int64), vectors.astype(np.float32))
        if len(keys) >= hnsw_threshold:
            # Imported here, not at start: usearch loaded before `ray` makes ray.init abort
            # (a C++ runtime clash: std::regex_error), and the Suite starts Ray at startup.
            from usearch.index import Index

            graph = Index(ndim=vectors.shape[1], metric="cos", dtype="f32",
                          connectivity=CONNECTIVITY, expansion_add=EXPANSION_ADD,
                          expansion_search=EXPANSION_SEARCH)
            graph.add(np.arange(len(keys), dtype=np.uint64), index.vectors)  # keys: row numbers
            index.hnsw = graph
        return index

    def search(self, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """The `k` best (key, cosine) pairs, best first."""
        if not len(self.keys):
            return []
        if self.hnsw is None:
            rows = np.arange(len(self.keys))
        else:
            found = self.hnsw.search(query.astype(np.float32), min(len(self.keys), k * CANDIDATES_FACTOR))
            rows = np.asarray(found.keys, dtype=np.int64)
        scores = self.vectors[rows] @ query
        top = np.argpartition(-scores, k - 1)[:k] if len(scores) > k else np.arange(len(scores))
        best = top[np.argsort(-scores[top], kind="stable")]
        return [(int(self.keys[rows[i]]), float(scores[i])) for i in best]
