"""schemathesis against our own served OpenAPI document (`/openapi.json`), over a real
socket to the session's test server: generated bodies (valid and invalid ones) for
every container operation must get no 5xx, only the status codes the document
declares, and bodies that conform to the declared schemas.

Generation is bounded (`MAX_EXAMPLES` per operation) and each generated body's
length-like fields are clamped (`_keep_it_fast`) so that one call costs a few
decoding steps at most; the document itself is not changed for the test.
"""

import os
import time

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi import checks as openapi_checks

MAX_EXAMPLES = int(os.environ.get("AMITY_SCHEMATHESIS_EXAMPLES", "20"))
CALL_TIMEOUT = 30
OPERATIONS = ["/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/tokenize",
              "/v1/detokenize", "/v1/chat/render"]
CHECKS = [
    not_a_server_error,
    openapi_checks.status_code_conformance,
    openapi_checks.content_type_conformance,
    openapi_checks.response_schema_conformance,
]

# Generated values for these would each be a long generation; a small cap keeps every
# call to a few steps while still exercising the field (0 and negatives pass through).
CAPS = {
    "max_tokens": 3, "max_completion_tokens": 3, "min_tokens": 2, "n": 2,
    "max_total_tokens": 40, "min_total_tokens": 8, "logprobs": 3, "top_logprobs": 3,
    "reasoning_budget": 3,
}


def _keep_it_fast(body):
    if not isinstance(body, dict):
        return body
    for key, cap in CAPS.items():
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            body[key] = cap
    has_limit = any(body.get(k) is not None
                    for k in ("max_tokens", "max_completion_tokens", "max_total_tokens"))
    if not has_limit and ("prompt" in body or "tokens" in body or "messages" in body):
        # Without a limit a request runs to the end of the context (2048 tokens here).
        body["max_tokens"] = 3
    if isinstance(body.get("prompt"), list) and len(body["prompt"]) > 2:
        body["prompt"] = body["prompt"][:2]  # each prompt is its own generation
    return body


FLOAT_RANGES = {
    "temperature": (0.0, 2.0), "top_p": (0.05, 1.0), "min_p": (0.0, 1.0),
    "xtc_threshold": (0.0, 1.0), "xtc_probability": (0.0, 1.0), "repetition_penalty": (0.5, 2.0),
    "frequency_penalty": (-2.0, 2.0), "presence_penalty": (-2.0, 2.0),
}
# Fields whose valid values depend on the model or on other fields: left out, so that
# an "in range" body gets as far as the model (the raw positive run still sends them).
DROPPED = (
    "model", "max_total_tokens", "min_total_tokens", "no_repeat_ngram", "encoder_no_repeat_ngram",
    "encoder_repetition_penalty", "embedding_to_replace", "token_index_to_replace",
    "response_format", "seed", "bad_word_tokens", "stop_tokens", "forced_output_tokens",
    "eos_token", "logit_bias", "max_completion_tokens", "tool_choice", "min_tokens",
)
VOCAB = 49152


def _in_range(path, body):
    """The generated body moved into the server's value ranges (which the document,
    like the spec, leaves to prose): what a well-behaved client sends."""
    if not isinstance(body, dict):
        return body
    body = {k: v for k, v in body.items() if k not in DROPPED}
    for key, (low, high) in FLOAT_RANGES.items():
        if isinstance(body.get(key), (int, float)) and not isinstance(body[key], bool):
            body[key] = min(max(float(body[key]), low), high)
    for key, low in (("top_k", 0), ("n", 1), ("max_tokens", 1), ("logprobs", 0),
                     ("top_logprobs", 0)):
        if isinstance(body.get(key), int) and not isinstance(body[key], bool):
            body[key] = max(body[key], low)
    if body.get("top_logprobs") is not None:
        body["logprobs"] = True
    if "tokens" in body and isinstance(body["tokens"], list):  # completions / detokenize
        body["tokens"] = [t % VOCAB for t in body["tokens"]] or [1]
    if body.get("prompt") is not None and body.get("tokens") is not None:
        del body["tokens"]
    if path == "/v1/completions" and body.get("prompt") is None and body.get("tokens") is None:
        body["prompt"] = "Hi"
    if isinstance(body.get("messages"), list):  # a text-only model: send it text
        for message in body["messages"]:
            if isinstance(message, dict) and isinstance(message.get("content"), list):
                message["content"] = [part for part in message["content"]
                                      if not isinstance(part, dict) or part.get("type") in
                                      ("text", "tool_use", "tool_result", "thinking",
                                       "redacted_thinking")] or "Hi"
    if isinstance(body.get("prompt"), list):
        body["prompt"] = [p or "Hi" for p in body["prompt"]] or ["Hi"]
    elif body.get("prompt") == "":
        body["prompt"] = "Hi"
    return body


@pytest.fixture(scope="session")
def api_schema(server):
    config = schemathesis.Config.from_dict({"request-timeout": 60})
    return schemathesis.openapi.from_url(f"{server.url}/openapi.json", config=config)


# schemathesis's own pytest integration (`schemathesis.pytest.from_fixture`) reads
# `request.node._nodeid`, which pytest 9 no longer has; its strategies under plain
# hypothesis do the same work.
@pytest.mark.parametrize("variant", ["positive", "in-range", "negative"])
@pytest.mark.parametrize("path", OPERATIONS)
def test_container_operations_conform_to_our_openapi(api_schema, server, path, variant):
    operation = api_schema[path]["POST"]
    mode = GenerationMode.NEGATIVE if variant == "negative" else GenerationMode.POSITIVE
    seen: dict[int, int] = {}
    slowest = [0.0]

    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
        suppress_health_check=list(hypothesis.HealthCheck), phases=[
            hypothesis.Phase.explicit, hypothesis.Phase.generate, hypothesis.Phase.shrink],
    )
    def check(case):
        if variant == "in-range":
            case.body = _in_range(path, case.body)
        case.body = _keep_it_fast(case.body)
        started = time.monotonic()
        # A hang is a failure too: no single call may take long.
        response = case.call_and_validate(base_url=server.url, checks=CHECKS, timeout=CALL_TIMEOUT)
        slowest[0] = max(slowest[0], time.monotonic() - started)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        if response.status_code == 422 and variant == "in-range":
            print("422:", response.text[:300])  # shown when the mostly-200 assertion fails
        if response.status_code == 200 and variant == "negative":
            print("accepted:", str(case.body)[:3000])

    check()
    print(f"{path} {variant}: statuses {seen}, slowest call {slowest[0]:.2f} s")
    assert seen, "no request was made"
    if variant == "in-range":  # these must mostly reach the model and answer
        assert seen.get(200, 0) >= MAX_EXAMPLES // 2, seen
    if variant == "negative":  # a body that breaks the document is refused, never served
        # Schemathesis's negative mode now and then yields a body that still fits the
        # document (e.g. a mutation the pydantic model tolerates), hence the margin. One
        # fresh-clone CI run saw 5 of 20 accepted /v1/messages bodies that no local run,
        # in any hash seed or order tried, reproduced; the bodies are printed above.
        assert set(seen) <= {200, 404, 422}, seen
        assert seen.get(200, 0) < MAX_EXAMPLES // 2, seen


def test_the_document_covers_every_container_operation(server, http):
    """The fuzzing above is only as good as the document: each operation must be in it,
    with its success and error responses declared."""
    doc = http.get("/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/v1/messages",
                 "/v1/tokenize", "/v1/detokenize", "/v1/chat/render"):
        responses = doc["paths"][path]["post"]["responses"]
        for status in ("200", "404", "422", "503"):
            assert status in responses, (path, status)
            assert "application/json" in responses[status]["content"], (path, status)
