"""The vector index: exact search against a brute-force ranking, and the HNSW graph's
recall against exact search on clustered vectors (as embeddings are)."""

import numpy as np
import pytest

from amity.suite.knowledge.embedder import unit_rows
from amity.suite.knowledge.index import VectorIndex

DIMENSION = 384
MIN_RECALL_AT_10 = 0.95
CORPUS = 5_000


def clustered(rng: np.random.Generator, count: int, clusters: int = 50, latent: int = 32) -> np.ndarray:
    """Unit vectors in clusters on a 32-dimensional subspace of R^384: sentence
    embeddings also have a low intrinsic dimension (on isotropic noise in 384
    dimensions, nearest neighbours barely differ from the rest, for any index)."""
    fixed = np.random.default_rng(1234)
    projection = fixed.standard_normal((latent, DIMENSION))
    centres = fixed.standard_normal((clusters, latent))
    members = centres[rng.integers(0, clusters, count)] + 0.6 * rng.standard_normal((count, latent))
    return unit_rows(members @ projection)


def test_exact_search_ranks_by_cosine_best_first():
    rng = np.random.default_rng(0)
    rows = clustered(rng, 500)
    keys = rng.permutation(10_000)[:500].astype(np.int64)  # keys are not row numbers
    index = VectorIndex.build(keys, rows, hnsw_threshold=10**9)
    assert index.hnsw is None
    query = unit_rows(rng.standard_normal((1, DIMENSION)))[0]
    found = index.search(query, 7)
    expected = np.argsort(-(rows @ query))[:7]
    assert [key for key, _ in found] == [int(keys[i]) for i in expected]
    assert np.allclose([score for _, score in found], (rows @ query)[expected], atol=1e-6)
    assert index.search(query, 10_000)[-1][1] == float((rows @ query).min())  # k past the end


@pytest.mark.slow
def test_hnsw_recall_against_exact_search():
    rng = np.random.default_rng(1)
    rows = clustered(rng, CORPUS)
    keys = np.arange(CORPUS, dtype=np.int64) + 100
    exact = VectorIndex.build(keys, rows, hnsw_threshold=10**9)
    graph = VectorIndex.build(keys, rows, hnsw_threshold=CORPUS)
    assert graph.hnsw is not None and exact.hnsw is None
    queries = clustered(rng, 200)
    hits = 0
    for query in queries:
        truth = {key for key, _ in exact.search(query, 10)}
        found = graph.search(query, 10)
        hits += len(truth & {key for key, _ in found})
        # Whatever the graph finds is scored exactly and sorted.
        scores = [score for _, score in found]
        assert scores == sorted(scores, reverse=True)
        by_key = dict(zip(keys.tolist(), (rows @ query).tolist()))
        assert np.allclose(scores, [by_key[key] for key, _ in found], atol=1e-6)
    recall = hits / (10 * len(queries))
    print(f"HNSW recall@10 vs exact: {recall:.3f}")
    assert recall >= MIN_RECALL_AT_10


def test_an_empty_base_finds_nothing():
    index = VectorIndex.build(np.zeros(0, np.int64), np.zeros((0, DIMENSION), np.float32), 1)
    assert index.search(np.ones(DIMENSION, np.float32), 5) == []
