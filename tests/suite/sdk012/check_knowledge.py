"""Run by tests/suite/knowledge/test_knowledge_process.py under .venv-sdk012
(friendli==0.12.8, whose `serverless.knowledge.retrieve` matches the spec), against a
real `amity suite` process whose knowledge base `amity knowledge create` made, over
real sockets. Not collected by the main run (see check_sdk.py).

Environment: SUITE_URL, SUITE_TOKEN, SUITE_TEAM, KNOWLEDGE_ID, KNOWLEDGE_QUESTION,
KNOWLEDGE_ANSWER (a phrase the best chunk must contain).
"""

import os

import pytest
from friendli import SyncFriendli
from friendli.core import models
from friendli.core.utils.retries import RetryConfig

URL, TOKEN, TEAM = os.environ["SUITE_URL"], os.environ["SUITE_TOKEN"], os.environ["SUITE_TEAM"]
KNOWLEDGE_ID = os.environ["KNOWLEDGE_ID"]
NO_RETRIES = RetryConfig("none", None, False)


@pytest.fixture
def client():
    with SyncFriendli(token=TOKEN, server_url=URL, retry_config=NO_RETRIES,
                      timeout_ms=300_000) as c:
        yield c


def test_retrieve(client):
    answer = client.serverless.knowledge.retrieve(
        query=os.environ["KNOWLEDGE_QUESTION"], k=3, knowledge_ids=[KNOWLEDGE_ID],
        x_friendli_team=TEAM)
    assert len(answer.results) == 3
    best = answer.results[0]
    assert os.environ["KNOWLEDGE_ANSWER"] in best.text
    assert best.content_chunk_id.startswith("chunk_") and best.content_id.startswith("doc_")
    scores = [r.score for r in answer.results]
    assert scores == sorted(scores, reverse=True)


def test_two_knowledge_ids_are_a_422(client):
    with pytest.raises(models.SDKError) as raised:
        client.serverless.knowledge.retrieve(query="q", k=1,
                                             knowledge_ids=[KNOWLEDGE_ID, KNOWLEDGE_ID])
    assert raised.value.status_code == 422


def test_an_unknown_base_is_a_404(client):
    with pytest.raises(models.SDKError) as raised:
        client.serverless.knowledge.retrieve(query="q", k=1, knowledge_ids=["kb_unknown"])
    assert raised.value.status_code == 404
