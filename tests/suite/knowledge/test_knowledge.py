"""Knowledge bases in an in-process Suite with a real all-MiniLM-L6-v2 embedding
container: retrieval quality on a corpus with known answers (exact search and the
HNSW index), scores that are the cosine of the container's own embeddings, documents
from the Files API and by upload (.txt, .md, .pdf), team isolation, and the 4xx
answers."""

import base64

import httpx
import numpy as np
import pytest

from amity.config import SuiteConfig
from amity.suite.knowledge import service
from amity.suite.knowledge.service import EmbeddingModel, Knowledge
from tests.suite import flows
from tests.suite.conftest import start_in_process
from tests.suite.knowledge.corpus import DOCUMENTS, QUESTIONS
from tests.suite.knowledge.pdf import make_pdf

MIN_RECALL_AT_5 = 0.9
RETRIEVE = "/serverless/v1/knowledge/retrieve"


def create(client, account, name="kb") -> str:
    response = client.post("/beta/knowledge", json={"name": name}, headers=account.headers)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def upload(client, account, knowledge_id: str, name: str, data: bytes):
    return client.post(f"/beta/knowledge/{knowledge_id}/document/upload",
                       files={"file": (name, data)}, headers=account.headers)


def retrieve(client, account, knowledge_id: str, query: str, k: int = 5):
    return client.post(RETRIEVE, json={"query": query, "k": k, "knowledgeIds": [knowledge_id]},
                       headers=account.headers)


def embed(url: str, texts: list[str]) -> np.ndarray:
    answer = httpx.post(f"{url}/v1/embeddings", json={"input": texts, "encoding_format": "base64"},
                        timeout=120).json()
    return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in answer["data"]])


@pytest.mark.slow
@pytest.mark.parametrize("hnsw_threshold", [20_000, 1], ids=["exact", "hnsw"])
def test_recall_at_5_on_a_corpus_with_known_answers(tmp_path, embedder_url, hnsw_threshold):
    suite = start_in_process(tmp_path / "suite", knowledge_embedding_url=embedder_url,
                             knowledge_hnsw_threshold=hnsw_threshold)
    try:
        client, admin = suite.client, suite.admin
        knowledge_id = create(client, admin, "corpus")
        names = {}
        for name, text in DOCUMENTS.items():
            added = upload(client, admin, knowledge_id, name, text.encode())
            assert added.status_code == 201, added.text
            assert added.json()["chunkCount"] >= 2  # several chunks per document
            names[added.json()["id"]] = name
        info = client.get(f"/beta/knowledge/{knowledge_id}", headers=admin.headers).json()
        assert info["documentCount"] == len(DOCUMENTS)
        assert info["embeddingModel"]

        found = 0
        for question, answer in QUESTIONS:
            response = retrieve(client, admin, knowledge_id, question)
            assert response.status_code == 200, response.text
            results = response.json()["results"]
            assert len(results) == 5
            scores = [r["score"] for r in results]
            assert scores == sorted(scores, reverse=True) and -1 <= scores[-1] <= scores[0] <= 1
            assert {r["contentId"] for r in results} <= set(names)
            assert len({r["contentChunkId"] for r in results}) == 5
            found += any(answer in r["text"] for r in results)
        recall = found / len(QUESTIONS)
        print(f"recall@5 ({'hnsw' if hnsw_threshold == 1 else 'exact'}): {recall:.2f}")
        assert recall >= MIN_RECALL_AT_5

        # The score is the cosine of the container's embeddings of the query and the chunk.
        question = QUESTIONS[0][0]
        best = retrieve(client, admin, knowledge_id, question, k=1).json()["results"][0]
        query_vector, chunk_vector = embed(embedder_url, [question, best["text"]])
        cosine = query_vector @ chunk_vector / np.linalg.norm(query_vector) / np.linalg.norm(chunk_vector)
        assert best["score"] == pytest.approx(float(cosine), abs=1e-5)
        index = suite.client.app.state.knowledge.cache.entries
        assert all((entry.hnsw is not None) == (hnsw_threshold == 1) for _, entry in index.values())
    finally:
        suite.client.__exit__(None, None, None)


@pytest.fixture(params=["sqlite", "postgresql"])
def either_database_suite(request, tmp_path, embedder_url):
    url = request.getfixturevalue("fresh_postgres") if request.param == "postgresql" else None
    running = start_in_process(tmp_path / "suite", url, knowledge_embedding_url=embedder_url)
    yield running
    running.client.__exit__(None, None, None)


def test_files_api_documents_pdf_listing_and_deletion(either_database_suite):
    client, admin = either_database_suite.client, either_database_suite.admin
    knowledge_id = create(client, admin)
    pdf = make_pdf([["The lighthouse keeper's cat is named Marmalade.",
                     "She sleeps on the lamp room stairs."],
                    ["The lighthouse was painted blue and white in 1932."]])
    pdf_id = flows.upload(client, admin, pdf, "keeper.pdf")
    md_id = flows.upload(client, admin, DOCUMENTS["biology.md"].encode(), "biology.md")
    added = client.post(f"/beta/knowledge/{knowledge_id}/document",
                        json={"fileIds": [pdf_id, md_id]}, headers=admin.headers)
    assert added.status_code == 201, added.text
    assert [(d["id"], d["fileId"], d["name"]) for d in added.json()["data"]] == [
        (pdf_id, pdf_id, "keeper.pdf"), (md_id, md_id, "biology.md")]

    results = retrieve(client, admin, knowledge_id, "What is the cat called?", k=2).json()["results"]
    assert results[0]["contentId"] == pdf_id and "Marmalade" in results[0]["text"]
    # A file is in a base once.
    again = client.post(f"/beta/knowledge/{knowledge_id}/document", json={"fileIds": [pdf_id]},
                        headers=admin.headers)
    assert again.status_code == 409, again.text

    # A PDF uploaded directly, too.
    direct = upload(client, admin, knowledge_id, "paint.pdf",
                    make_pdf([["The garden shed roof is green tin."]]))
    assert direct.status_code == 201, direct.text
    assert direct.json()["id"].startswith("doc_") and direct.json()["fileId"] is None
    listed = client.get(f"/beta/knowledge/{knowledge_id}/document", headers=admin.headers).json()
    assert [d["id"] for d in listed["data"]] == [pdf_id, md_id, direct.json()["id"]]

    gone = client.delete(f"/beta/knowledge/{knowledge_id}/document/{pdf_id}", headers=admin.headers)
    assert gone.status_code == 200, gone.text
    results = retrieve(client, admin, knowledge_id, "What is the cat called?", k=100).json()["results"]
    assert results and all(r["contentId"] != pdf_id for r in results)
    assert not any("Marmalade" in r["text"] for r in results)
    info = client.get(f"/beta/knowledge/{knowledge_id}", headers=admin.headers).json()
    assert info["documentCount"] == 2 and info["embeddingModel"]
    for document in (md_id, direct.json()["id"]):
        assert client.delete(f"/beta/knowledge/{knowledge_id}/document/{document}",
                             headers=admin.headers).status_code == 200
    info = client.get(f"/beta/knowledge/{knowledge_id}", headers=admin.headers).json()
    assert (info["documentCount"], info["chunkCount"], info["embeddingModel"]) == (0, 0, None)
    assert retrieve(client, admin, knowledge_id, "cat").json() == {"results": []}

    assert client.delete(f"/beta/knowledge/{knowledge_id}", headers=admin.headers).status_code == 200
    assert retrieve(client, admin, knowledge_id, "cat").status_code == 404
    assert client.get("/beta/knowledge", headers=admin.headers).json()["data"] == []


def test_another_teams_base_is_not_found(knowledge_suite):
    client, admin, other = knowledge_suite.client, knowledge_suite.admin, knowledge_suite.other
    knowledge_id = create(client, admin)
    assert upload(client, admin, knowledge_id, "a.txt", b"Owls hunt at night.").status_code == 201
    own = retrieve(client, admin, knowledge_id, "owls")
    assert own.status_code == 200 and own.json()["results"]

    theirs = retrieve(client, other, knowledge_id, "owls")
    assert theirs.status_code == 404, theirs.text
    assert theirs.json()["detail"][0]["loc"] == ["body", "knowledgeIds", 0]
    for method, path in [("GET", ""), ("DELETE", ""), ("GET", "/document")]:
        response = client.request(method, f"/beta/knowledge/{knowledge_id}{path}", headers=other.headers)
        assert response.status_code == 404, (method, path, response.text)
    assert upload(client, other, knowledge_id, "b.txt", b"Mine now.").status_code == 404
    assert client.get("/beta/knowledge", headers=other.headers).json()["data"] == []
    # Nor can a base take another team's file.
    their_file = flows.upload(client, other, b"Secret plans.", "plans.txt")
    stolen = client.post(f"/beta/knowledge/{knowledge_id}/document", json={"fileIds": [their_file]},
                         headers=admin.headers)
    assert stolen.status_code == 404, stolen.text
    assert retrieve(client, admin, "kb_doesnotexist", "owls").status_code == 404
    assert client.post(RETRIEVE, json={"query": "owls", "k": 1, "knowledgeIds": [knowledge_id]}
                       ).status_code == 401


@pytest.mark.parametrize("body,where", [
    ({"query": "q", "k": 1, "knowledgeIds": ["a", "b"]}, ["body", "knowledgeIds"]),
    ({"query": "q", "k": 1, "knowledgeIds": []}, ["body", "knowledgeIds"]),
    ({"query": "q", "k": 0, "knowledgeIds": ["a"]}, ["body", "k"]),
    ({"query": "q", "k": 101, "knowledgeIds": ["a"]}, ["body", "k"]),
    ({"query": "q", "knowledgeIds": ["a"]}, ["body", "k"]),
    ({"query": "", "k": 1, "knowledgeIds": ["a"]}, ["body", "query"]),
    ({"k": 1, "knowledgeIds": ["a"]}, ["body", "query"]),
])
def test_bad_retrieve_bodies_are_422(knowledge_suite, body, where):
    response = knowledge_suite.client.post(RETRIEVE, json=body, headers=knowledge_suite.admin.headers)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == where


@pytest.mark.parametrize("name,data", [
    ("notes.docx", b"PK\x03\x04 a word file"),
    ("latin1.txt", "caf\xe9".encode("latin-1")),
    ("blank.md", b" \n\n "),
    ("broken.pdf", b"%PDF-1.4 this is not really a pdf"),
])
def test_unreadable_documents_are_422_and_change_nothing(knowledge_suite, name, data):
    client, admin = knowledge_suite.client, knowledge_suite.admin
    knowledge_id = create(client, admin)
    response = upload(client, admin, knowledge_id, name, data)
    assert response.status_code == 422, response.text
    assert client.get(f"/beta/knowledge/{knowledge_id}", headers=admin.headers).json()["documentCount"] == 0
    # An empty base answers with no results.
    assert retrieve(client, admin, knowledge_id, "anything").json() == {"results": []}


def test_a_request_adds_all_its_files_or_none(knowledge_suite):
    client, admin = knowledge_suite.client, knowledge_suite.admin
    knowledge_id = create(client, admin)
    good = flows.upload(client, admin, b"Herons stand still in shallow water.", "herons.txt")
    bad = flows.upload(client, admin, b"\x00\x01binary", "blob.bin")
    response = client.post(f"/beta/knowledge/{knowledge_id}/document",
                           json={"fileIds": [good, bad]}, headers=admin.headers)
    assert response.status_code == 422, response.text
    missing = client.post(f"/beta/knowledge/{knowledge_id}/document",
                          json={"fileIds": [good, "file_nope"]}, headers=admin.headers)
    assert missing.status_code == 404 and missing.json()["detail"][0]["loc"] == ["body", "fileIds", 1]
    listed = client.get(f"/beta/knowledge/{knowledge_id}/document", headers=admin.headers)
    assert listed.json() == {"data": []}


def test_an_embedder_that_cannot_start_is_a_503_after_the_requests_own_faults(
        knowledge_suite, monkeypatch):
    client, admin = knowledge_suite.client, knowledge_suite.admin
    knowledge_id = create(client, admin)
    assert upload(client, admin, knowledge_id, "a.txt", b"Owls hunt at night.").status_code == 201
    empty_id = create(client, admin, "empty")
    # As after a restart without --knowledge-embedding-url, where the Suite's own
    # embedder's package is missing.
    client.app.state.knowledge = Knowledge.from_config(SuiteConfig(), knowledge_suite.sessions)
    monkeypatch.setattr(service, "EMBEDDER", EmbeddingModel("acme/missing", "zip:no_such_package",
                                                            "scale-to-zero"))
    response = retrieve(client, admin, knowledge_id, "owls")
    assert response.status_code == 503
    assert "no_such_package is not installed" in response.json()["detail"][0]["msg"]
    assert upload(client, admin, knowledge_id, "b.txt", b"text").status_code == 503
    # The request's own faults come first, and an empty base needs no embedder.
    assert retrieve(client, admin, "kb_unknown", "owls").status_code == 404
    assert upload(client, admin, "kb_unknown", "b.txt", b"text").status_code == 404
    assert retrieve(client, admin, empty_id, "owls").json() == {"results": []}
    # Bases are still listed, and can be deleted.
    assert len(client.get("/beta/knowledge", headers=admin.headers).json()["data"]) == 2
    assert client.delete(f"/beta/knowledge/{empty_id}", headers=admin.headers).status_code == 200
