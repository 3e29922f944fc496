"""The serverless routes' own rules, before any model runs: the catalog, model
resolution, the tool-assisted body's refusals, and the Accept rule for streaming."""

import pytest

from amity.suite.serverless.catalog import BUILT_IN, load_catalog
from amity.suite.serverless.endpoints import parse_model_urls
from amity.suite.accept import wants_stream
from tests.suite.conftest import start_in_process

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHISPER = "openai/whisper-tiny.en"
CHAT = "/serverless/tools/v1/chat/completions"
REQUIRED = {"id", "name", "max_completion_tokens", "context_length", "functionality", "pricing",
            "hugging_face_url", "description", "license", "policy", "created"}

CUSTOM = """
[[models]]
id = "acme/no-tools"
name = "No tools"
description = "A model without built-in tools."
source = "/models/no-tools.gguf"
replicas = "scale-to-zero"
max_completion_tokens = 100
context_length = 1000
hugging_face_url = "https://example.com/no-tools"
license = "https://example.com/license"
policy = "https://example.com/policy"
created = 1700000000
deprecation_date = "2030-01-01"
functionality = { tool_call = false, builtin_tool = false, parallel_tool_call = false }
pricing = { input = 0.0000001, output = 0.0000002, input_cache_read = 0.00000005 }
"""


def test_models_list_needs_no_token_and_tolerates_one(suite):
    anonymous = suite.client.get("/serverless/v1/models")
    assert anonymous.status_code == 200
    with_token = suite.client.get("/serverless/v1/models", headers=suite.admin.headers)
    bad_token = suite.client.get("/serverless/v1/models",
                                 headers={"Authorization": "Bearer nonsense"})
    assert anonymous.json() == with_token.json() == bad_token.json()
    models = {m["id"]: m for m in anonymous.json()["data"]}
    assert set(models) == {SMOL, "Qwen/Qwen2.5-Coder-0.5B-Instruct", WHISPER}
    for m in models.values():
        assert REQUIRED <= set(m) and m["policy"] is None
        assert m["functionality"]["builtin_tool"] is (m["id"] != WHISPER)
        assert set(m["pricing"]) >= {"input", "output", "prompt", "completion", "unit_type"}
    assert models[WHISPER]["pricing"]["unit_type"] == "AUDIO_MINUTE"


def test_a_catalog_file_replaces_the_built_in_one(tmp_path):
    path = tmp_path / "catalog.toml"
    path.write_text(CUSTOM)
    suite = start_in_process(tmp_path / "suite", catalog=str(path))
    (m,) = suite.client.get("/serverless/v1/models").json()["data"]
    assert m["id"] == "acme/no-tools" and m["deprecation_date"] == "2030-01-01"
    assert m["pricing"]["prompt"] == m["pricing"]["input"] == 0.0000001
    assert m["pricing"]["completion"] == 0.0000002 and m["pricing"]["input_cache_read"] == 5e-8
    assert m["functionality"]["structured_output"] is True  # the spec's default
    assert m["policy"] == "https://example.com/policy"
    refused = suite.client.post(CHAT, headers=suite.admin.headers, json={
        "model": "acme/no-tools", "messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 422 and "builtin_tool" in refused.json()["detail"][0]["msg"]


@pytest.mark.parametrize("text, problem", [
    ("[[models]]\nid = 'x'\n", "Field required"),
    (CUSTOM + CUSTOM, "twice"),
    (CUSTOM.replace('replicas = "scale-to-zero"', 'replicas = "sometimes"'), "replicas"),
    ("not toml [", "cannot read"),
])
def test_a_bad_catalog_fails_at_start(tmp_path, text, problem):
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=problem):
        load_catalog(str(path))


def test_built_in_catalog_loads():
    catalog = load_catalog(None)
    assert catalog.get(SMOL).source == "default" and catalog.get(WHISPER).source == "whisper-tiny.en"
    assert BUILT_IN.exists()


def body(**extra):
    return {"model": SMOL, "messages": [{"role": "user", "content": "What is 2+2?"}],
            "tools": [{"type": "math:calculator"}], **extra}


@pytest.mark.parametrize("extra, status, where", [
    ({"min_tokens": 5}, 422, "min_tokens"),
    ({"response_format": {"type": "json_object"}}, 422, "response_format"),
    ({"model": "nobody/nothing"}, 404, "no serverless model"),
    ({"tools": [{"type": "file:text", "files": ["file_a", "file_b"]}]}, 422, "at most 1"),
    ({"tools": [{"type": "math:abacus"}]}, 422, "tag"),
    ({"tools": [{"type": "function", "function": {"name": "math_calculator"}}]}, 422, "taken"),
    ({"tools": [{"type": "function", "function": {"name": "bad:name"}}]}, 422, "pattern"),
    ({"tool_choice": {"type": "function", "function": {"name": "web:url"}}}, 422, "not in"),
    ({"tools": [], "tool_choice": "required"}, 422, "no `tools`"),
    ({"n": 2}, 422, "less than or equal"),
    ({"tools": [{"type": "math:calculator"}, {"type": "math:calculator"}]}, 422, "twice"),
])
def test_refusals_before_any_model_runs(suite, extra, status, where):
    response = suite.client.post(CHAT, json=body(**extra), headers=suite.admin.headers)
    assert response.status_code == status, response.text
    assert where in response.text


def test_tool_assisted_chat_needs_a_token(suite):
    assert suite.client.post(CHAT, json=body()).status_code == 401


def test_model_urls_parse():
    urls = parse_model_urls(f"{SMOL}=http://127.0.0.1:9/, b=https://h:1")
    assert urls == {SMOL: "http://127.0.0.1:9", "b": "https://h:1"}
    for bad in ("nourl", "a=ftp://x"):
        with pytest.raises(ValueError):
            parse_model_urls(bad)


@pytest.mark.parametrize("stream, accept, expected", [
    (True, None, True), (False, "text/event-stream", False), (None, "text/event-stream", True),
    (None, None, False), (None, "application/json", False), (None, "*/*", False),
    # friendli 0.16.5's container calls: JSON preferred even when streaming.
    (None, "application/json;q=1, text/event-stream;q=0", False),
    (None, "text/event-stream;q=0.9, application/json;q=0.5", True),
])
def test_accept_rule(stream, accept, expected):
    assert wants_stream(stream, accept) is expected


INFERENCE = ["/serverless/v1/chat/completions", "/serverless/v1/chat/render",
             "/serverless/v1/messages", "/serverless/v1/completions", "/serverless/v1/tokenize",
             "/serverless/v1/detokenize"]
TRANSCRIPTIONS = "/serverless/v1/audio/transcriptions"


@pytest.mark.parametrize("path", INFERENCE)
def test_inference_resolves_model_in_the_catalog(suite, path):
    unknown = suite.client.post(path, json={"model": "nobody/nothing", "prompt": "x"},
                                headers=suite.admin.headers)
    assert unknown.status_code == 404 and "no serverless model" in unknown.text
    assert unknown.json()["detail"][0]["loc"] == ["body", "model"]
    missing = suite.client.post(path, json={"prompt": "x"}, headers=suite.admin.headers)
    assert missing.status_code == 422 and "catalog id" in missing.text
    assert suite.client.post(path, json={"model": SMOL}).status_code == 401
    not_json = suite.client.post(path, content=b"model=x", headers={
        **suite.admin.headers, "Content-Type": "text/plain"})
    assert not_json.status_code == 415


def test_transcriptions_read_model_from_the_form(suite):
    files = {"file": ("a.wav", b"RIFF....", "audio/wav")}
    unknown = suite.client.post(TRANSCRIPTIONS, data={"model": "nobody/nothing"}, files=files,
                                headers=suite.admin.headers)
    assert unknown.status_code == 404 and "no serverless model" in unknown.text
    missing = suite.client.post(TRANSCRIPTIONS, files=files, headers=suite.admin.headers)
    assert missing.status_code == 422 and "catalog id" in missing.text
    broken = suite.client.post(TRANSCRIPTIONS, content=b"--x\r\nnonsense", headers={
        **suite.admin.headers, "Content-Type": "multipart/form-data; boundary=x"})
    assert broken.status_code == 422


def test_a_model_that_cannot_start_is_a_503_naming_why(tmp_path):
    path = tmp_path / "catalog.toml"
    path.write_text(CUSTOM.replace("/models/no-tools.gguf", str(tmp_path / "missing.gguf")))
    suite = start_in_process(tmp_path / "suite", catalog=str(path))
    try:
        for _ in range(2):  # a failed start is not remembered: the next request tries again
            response = suite.client.post("/serverless/v1/tokenize", headers=suite.admin.headers,
                                         json={"model": "acme/no-tools", "prompt": "x"})
            assert response.status_code == 503, response.text
            assert "acme/no-tools could not start" in response.text
            assert "missing.gguf" in response.text
        assert "serverless:acme/no-tools" not in suite.client.app.state.replicas.named
    finally:
        suite.client.__exit__(None, None, None)
