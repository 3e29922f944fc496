"""Bad input: a 422 in the spec's shape that names the field, never a 500 or a hang,
and the server keeps serving."""

import time

import pytest

LONG = "word " * 2100  # past the 2048-token context the test server runs with
CHAT = [{"role": "user", "content": "hi"}]

CASES = [
    # (path, body, a loc element the error must name)
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "x", "top_p": 1.5}, "top_p"),
    ("/v1/completions", {"prompt": "x", "temperature": -0.1}, "temperature"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 5, "max_total_tokens": 9}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "min_tokens": 2,
                         "response_format": {"type": "json_object"}}, "min_tokens"),
    ("/v1/completions", {"prompt": "x", "tokens": [1, 2]}, "body"),
    ("/v1/completions", {"max_tokens": 3}, "body"),
    ("/v1/completions", {"tokens": [49152]}, "tokens"),
    ("/v1/completions", {"tokens": [-1]}, "tokens"),
    ("/v1/completions", {"prompt": LONG}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 5000}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "x", "n": 2, "seed": [1]}, "seed"),
    ("/v1/completions", {"prompt": "x", "stop_tokens": [{"tokens": [10**9]}]}, "stop_tokens"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": []}, "body"),
    ("/v1/completions", {"prompt": "x", "encoder_no_repeat_ngram": 3}, "encoder_no_repeat_ngram"),
    ("/v1/completions", {"prompt": "x", "embedding_to_replace": [0.1]}, "token_index_to_replace"),
    ("/v1/completions", {"prompt": 5}, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "logprobs": 50}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "top_k": -1}, "top_k"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "n": 10**6}, "n"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "n": 10**30}, "n"),
    ("/v1/completions", {"prompt": ["x"] * 20, "max_tokens": 1, "n": 10}, "n"),
    ("/v1/completions", {"prompt": "x", "embedding_to_replace": [0.1, 0.2],
                         "token_index_to_replace": [0]}, "embedding_to_replace"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**30}, "max_tokens"),
    ("/v1/completions", {"tokens": [10**30]}, "tokens"),
    ("/v1/completions", {"prompt": "x " * 500_000}, "prompt"),  # 1 MB
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 1, "n": 10**6}, "n"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": -1}, "logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "top_k": -3}, "top_k"),
    ("/v1/detokenize", {"tokens": [10**30]}, "tokens"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, "body"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 50}, "logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, "content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, "messages"),
    ("/v1/chat/completions", {"messages": CHAT, "tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/render", {"messages": "hi"}, "messages"),
    ("/v1/tokenize", {"prompt": 3}, "prompt"),
    ("/v1/tokenize", {}, "prompt"),
    ("/v1/detokenize", {"tokens": [1, 99999999]}, "tokens"),
    ("/v1/detokenize", {"tokens": "abc"}, "tokens"),
    ("/v1/detokenize", {"tokens": [False]}, "tokens"),  # a boolean is not a token id
    ("/v1/completions", {"tokens": [True, 5], "max_tokens": 2}, "tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2, "bad_words": [""]}, "bad_words"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2, "bad_words": ["ok", " "]}, "bad_words"),
]


@pytest.mark.parametrize("path,body,field", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input_is_422(http, path, body, field):
    res = http.post(path, json=body)
    assert res.status_code == 422, res.text
    detail = res.json()["detail"]
    assert isinstance(detail, list) and detail
    for item in detail:
        assert set(item) == {"loc", "msg", "type"}
        assert item["loc"][0] == "body" and item["msg"]
    assert any(field in map(str, item["loc"]) for item in detail), detail


@pytest.mark.parametrize("content,ctype,type_", [
    (b'{"prompt": "\xff\xfe", "max_tokens": 1}', "application/json", "json_invalid"),  # not UTF-8
    (b"[" * 100_000 + b"]" * 100_000, "application/json", "json_invalid"),  # nested too deep
    (b'{"prompt": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001, "application/json", "json_invalid"),
    (b'{"prompt": "x", "max_tokens": 1}', "text/plain", "content_type"),
    (b"prompt=x&max_tokens=1", "application/x-www-form-urlencoded", "content_type"),
    (b'{"prompt": "x", "max_tokens": 1}', None, "content_type"),
    (b"", "application/json", "missing"),
    (b"[1, 2]", "application/json", "model_attributes_type"),
], ids=["non-utf8", "nested-array", "nested-object", "text-plain", "form", "no-content-type",
        "empty", "array"])
def test_unreadable_bodies_are_422(http, content, ctype, type_):
    headers = {"content-type": ctype} if ctype else {}
    res = http.post("/v1/completions", content=content, headers=headers, timeout=30)
    assert res.status_code == 422, res.text
    [item] = res.json()["detail"]
    assert item["loc"] == ["body"] and item["type"] == type_ and item["msg"], item


def test_huge_n_is_refused_at_once_and_disturbs_no_one(http):
    started = time.monotonic()
    res = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "n": 10**6})
    assert res.status_code == 422 and time.monotonic() - started < 5, res.text
    res = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=20)
    assert res.status_code == 200, res.text


def test_malformed_json_is_422(http):
    res = http.post("/v1/completions", content=b'{"prompt": "x",',
                    headers={"content-type": "application/json"})
    assert res.status_code == 422 and res.json()["detail"][0]["loc"][0] == "body"


@pytest.mark.parametrize("body", [
    {"messages": [], "max_tokens": 4},
    {"messages": CHAT, "max_tokens": -4},
    {"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "url", "url": "http://x/y.png"}}]}], "max_tokens": 4},
    {"messages": CHAT, "tool_choice": {"type": "any"}},
])
def test_messages_errors_use_messages_shape(http, body):
    res = http.post("/v1/messages", json=body)
    assert res.status_code == 422
    err = res.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["message"]


def test_server_keeps_serving_after_bad_input(http):
    for path, body, _ in CASES:
        http.post(path, json=body)
    res = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3})
    assert res.status_code == 200 and len(res.json()["choices"][0]["tokens"]) == 3
    assert http.get("/health").status_code == 200


def test_bearer_token_is_ignored(http):
    res = http.post("/v1/tokenize", json={"prompt": "a"}, headers={"Authorization": "Bearer x"})
    assert res.status_code == 200


# JSON has no NaN or Infinity, but Python's parser (and so FastAPI's) reads the
# literals, and 1e400 overflows to inf: every float field must refuse them.
NON_FINITE = [
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "temperature": NaN}', "temperature"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "temperature": Infinity}', "temperature"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "top_p": NaN}', "top_p"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "min_p": NaN}', "min_p"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "repetition_penalty": Infinity}',
     "repetition_penalty"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "presence_penalty": NaN}',
     "presence_penalty"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "frequency_penalty": -Infinity}',
     "frequency_penalty"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "xtc_threshold": NaN}', "xtc_threshold"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "embedding_to_replace": [NaN], '
                        '"token_index_to_replace": [0]}', "embedding_to_replace"),
    ("/v1/completions", '{"prompt": "x", "max_tokens": 1, "temperature": 1e400}', "temperature"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, '
                             '"logit_bias": {"5": NaN}}', "logit_bias"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, '
                             '"logit_bias": {"5": -Infinity}}', "logit_bias"),
    ("/v1/messages", '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, '
                     '"temperature": NaN}', "temperature"),
]


@pytest.mark.parametrize("path,content,field", NON_FINITE,
                         ids=[f"{c[0]}-{c[2]}-{i}" for i, c in enumerate(NON_FINITE)])
def test_non_finite_numbers_are_422(http, path, content, field):
    res = http.post(path, content=content.encode(), headers={"content-type": "application/json"})
    assert res.status_code == 422, res.text
    if path == "/v1/messages":
        assert field in res.json()["error"]["message"], res.text
    else:
        assert any(field in map(str, item["loc"]) for item in res.json()["detail"]), res.text
