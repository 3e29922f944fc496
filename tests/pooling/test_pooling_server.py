"""The pooling routes over a real socket, judged by the official clients: the `openai`
SDK's `embeddings.create` (float and base64) on all-MiniLM-L6-v2 against
sentence-transformers' `encode`, and the `friendli` SDK's
`container.text_classification.classify` on the real intent classifier (MiniLM and
the rag-intent-classifier head as arrays) against numpy on the same arrays; then
the 4xx cases, and which routes each task serves.
"""

import base64
import shutil

import httpx
import numpy as np
import openai
import pytest
import torch
from friendli import SyncFriendli
from friendli.core.utils.retries import RetryConfig

from amity.config import EngineConfig
from amity.engine.async_engine import AsyncEngine
from amity.models.setfit_head import save_linear_head
from tests.models.test_pooling_real_models import TEXTS, _rag_intent_head
from tests.server.conftest import RunningServer, free_port

MIN_COSINE = 0.9999
INTENTS = {"set an alarm for 7 am": "alarm", "what is the weather like tomorrow": "weather",
           "please let me talk to a real person": "connect_to_human"}


def start(path) -> RunningServer:
    engine = AsyncEngine.from_config(EngineConfig(model=str(path), dtype="float32"))
    return RunningServer(engine, free_port())


@pytest.fixture(scope="module")
def embed_server(minilm_dir):
    with start(minilm_dir) as running:
        yield running


@pytest.fixture(scope="module")
def intent_dir(minilm_dir, tmp_path_factory):
    classifier, labels = _rag_intent_head()
    directory = tmp_path_factory.mktemp("minilm-intents") / "model"
    shutil.copytree(minilm_dir, directory)
    save_linear_head(directory, classifier.coef_, classifier.intercept_, labels, normalize_embeddings=False)
    return classifier, directory


@pytest.fixture(scope="module")
def classify_server(intent_dir):
    with start(intent_dir[1]) as running:
        yield running


@pytest.fixture(scope="module")
def sentence_transformer(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


def test_openai_embeddings_float_and_base64_match_sentence_transformers(embed_server, sentence_transformer):
    client = openai.OpenAI(base_url=embed_server.url + "/v1", api_key="ignored", max_retries=0)
    model = client.models.list().data[0].id
    reference = torch.from_numpy(sentence_transformer.encode(TEXTS))
    as_float = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    as_base64 = client.embeddings.create(model=model, input=TEXTS, encoding_format="base64")
    by_default = client.embeddings.create(model=model, input=TEXTS)  # the SDK asks for base64
    assert [d.index for d in as_float.data] == list(range(len(TEXTS)))
    floats = torch.tensor([d.embedding for d in as_float.data])
    raw = [d.embedding for d in as_base64.data]
    decoded = torch.tensor(np.stack([np.frombuffer(base64.b64decode(e), dtype="<f4") for e in raw]))
    assert floats.shape == (len(TEXTS), 384)
    assert torch.equal(decoded, floats)  # the same float32 numbers, either way
    assert torch.equal(torch.tensor([d.embedding for d in by_default.data]), floats)
    cosines = torch.nn.functional.cosine_similarity(floats, reference)
    assert cosines.min() >= MIN_COSINE, cosines
    token_counts = [len(sentence_transformer.tokenizer(t)["input_ids"]) for t in TEXTS]
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens == sum(token_counts)
    # One text alone gets the vector it got in the batch; the empty text embeds.
    [single] = client.embeddings.create(model=model, input=TEXTS[2], encoding_format="float").data
    assert TEXTS[2] == "" and torch.equal(torch.tensor(single.embedding), floats[2])


def test_embeddings_from_token_ids(embed_server, sentence_transformer):
    ids = sentence_transformer.tokenizer("A man is playing a guitar.")["input_ids"]
    body = httpx.post(embed_server.url + "/v1/embeddings", json={"tokens": ids}, timeout=60).json()
    reference = torch.from_numpy(sentence_transformer.encode(["A man is playing a guitar."]))[0]
    assert body["object"] == "list" and body["data"][0]["object"] == "embedding"
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids),
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert torch.nn.functional.cosine_similarity(torch.tensor(body["data"][0]["embedding"]), reference, 0) > MIN_COSINE


def test_friendli_sdk_classifies_with_the_real_intent_head(classify_server, intent_dir, sentence_transformer):
    classifier, _ = intent_dir
    with SyncFriendli(token="not-checked", retry_config=RetryConfig("none", None, False),
                      timeout_ms=120_000) as friendli:
        res = friendli.container.text_classification.classify(input_=list(INTENTS), server_url=classify_server.url)
        one = friendli.container.text_classification.classify(input_="set an alarm for 7 am",
                                                              server_url=classify_server.url)
    assert [d.index for d in res.data] == [0, 1, 2]
    assert [d.label for d in res.data] == list(INTENTS.values())
    assert all(d.num_classes == 157 and len(d.probs) == 157 for d in res.data)
    assert one.data[0].label == "alarm" and one.data[0].probs == res.data[0].probs
    # numpy on the same arrays: the head over sentence-transformers' embeddings.
    scores = sentence_transformer.encode(list(INTENTS)).astype(np.float64) @ classifier.coef_.T + classifier.intercept_
    reference = np.exp(scores - scores.max(1, keepdims=True))
    reference /= reference.sum(1, keepdims=True)
    np.testing.assert_allclose(np.array([d.probs for d in res.data]), reference, atol=1e-5, rtol=0)
    assert res.usage.prompt_tokens == res.usage.total_tokens > 0


def detail(response: httpx.Response) -> dict:
    return response.json()["detail"][0]


def test_bad_pooling_requests_are_4xx(embed_server, classify_server):
    post = lambda server, path, body: httpx.post(server.url + path, json=body, timeout=60)  # noqa: E731
    long_text = "word " * 300
    r = post(embed_server, "/v1/embeddings", {"input": ["fine", long_text]})
    assert r.status_code == 422 and detail(r)["loc"] == ["body", "input", 1] and "256" in detail(r)["msg"]
    r = post(embed_server, "/v1/embeddings", {"tokens": [101] * 257})
    assert r.status_code == 422 and detail(r)["loc"] == ["body", "tokens"] and "256" in detail(r)["msg"]
    for body in ({"input": "a", "tokens": [101]}, {}, {"input": []}, {"input": "a", "encoding_format": "int8"},
                 {"input": [1, 2]}):
        r = post(embed_server, "/v1/embeddings", body)
        assert r.status_code == 422, (body, r.text)
    assert "either" in detail(post(embed_server, "/v1/embeddings", {}))["msg"]
    assert "only one" in detail(post(embed_server, "/v1/embeddings", {"input": "a", "tokens": [1]}))["msg"]
    assert "empty list" in detail(post(embed_server, "/v1/embeddings", {"input": []}))["msg"]
    r = post(embed_server, "/v1/embeddings", {"tokens": [10**7]})
    assert r.status_code == 422 and "vocabulary" in detail(r)["msg"]
    r = post(embed_server, "/v1/embeddings", {"input": "a", "model": "another"})
    assert r.status_code == 404
    r = post(classify_server, "/classify", {"input": []})
    assert r.status_code == 422
    # Wrong task: a 400 naming the model's task and what it serves.
    for server, path, body, task, serves in (
            (embed_server, "/classify", {"input": "a"}, "embed", "/v1/embeddings"),
            (embed_server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
             "embed", "/v1/embeddings"),
            (embed_server, "/v1/completions", {"prompt": "hi"}, "embed", "/v1/embeddings"),
            (classify_server, "/v1/embeddings", {"input": "a"}, "classify", "/classify")):
        r = post(server, path, body)
        assert r.status_code == 400, (path, r.text)
        msg = detail(r)["msg"]
        assert f"is a {task} model" in msg and serves in msg, msg
    r = post(embed_server, "/v1/messages", {"model": "m", "max_tokens": 5,
                                            "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "is a embed model" in r.json()["error"]["message"]
    # What every model serves still works.
    assert httpx.post(embed_server.url + "/v1/tokenize", json={"prompt": "hi"}).status_code == 200
    assert httpx.get(embed_server.url + "/health").status_code == 200
