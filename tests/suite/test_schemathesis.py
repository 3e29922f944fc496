"""schemathesis over the Suite's own OpenAPI document (`/openapi.json`), over a real
socket to a real `amity suite` process: generated requests, valid and invalid, for
every operation get no 5xx, only declared status codes, and bodies that conform.
Bounded to `MAX_EXAMPLES` per operation and mode."""

import os

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi import checks as openapi_checks

from tests.suite.conftest import ADMIN_TOKEN

MAX_EXAMPLES = int(os.environ.get("AMITY_SCHEMATHESIS_EXAMPLES", "15"))
CHECKS = [not_a_server_error, openapi_checks.status_code_conformance,
          openapi_checks.content_type_conformance, openapi_checks.response_schema_conformance]


@pytest.fixture(scope="module")
def api_schema(suite_process):
    return schemathesis.openapi.from_url(f"{suite_process.url}/openapi.json")


def _operations():
    # The document is fetched at test time; the routes are listed here so that each
    # is its own test (and a missing one fails test_the_document_covers_...).
    return [("POST", "/beta/file"), ("PATCH", "/beta/file/{file_id}"),
            ("GET", "/beta/file/{file_id}"), ("GET", "/beta/file/{file_id}/download_url"),
            ("POST", "/beta/dataset"), ("GET", "/beta/dataset"),
            ("GET", "/beta/dataset/{dataset_id}"), ("DELETE", "/beta/dataset/{dataset_id}"),
            ("POST", "/beta/dataset/{dataset_id}/version"),
            ("GET", "/beta/dataset/{dataset_id}/version"),
            ("GET", "/beta/dataset/{dataset_id}/version/{version_id}"),
            ("DELETE", "/beta/dataset/{dataset_id}/version/{version_id}"),
            ("POST", "/beta/dataset/{dataset_id}/split"), ("GET", "/beta/dataset/{dataset_id}/split"),
            ("GET", "/beta/dataset/{dataset_id}/split/{split_id}"),
            ("DELETE", "/beta/dataset/{dataset_id}/split/{split_id}"),
            ("POST", "/beta/dataset/{dataset_id}/split/{split_id}/sample"),
            ("GET", "/beta/dataset/{dataset_id}/split/{split_id}/sample"),
            ("PUT", "/beta/dataset/{dataset_id}/split/{split_id}/sample"),
            ("POST", "/beta/dataset/{dataset_id}/split/{split_id}/sample/delete"),
            ("POST", "/objects/upload"), ("GET", "/objects/{key}"),
            ("GET", "/serverless/v1/models"), ("POST", "/serverless/tools/v1/chat/completions"),
            *[("POST", "/serverless" + path) for path in (
                "/v1/chat/completions", "/v1/chat/render", "/v1/messages", "/v1/completions",
                "/v1/tokenize", "/v1/detokenize", "/v1/audio/transcriptions")],
            *ENDPOINT_OPERATIONS, *KNOWLEDGE_OPERATIONS]


KNOWLEDGE = "/beta/knowledge"
KNOWLEDGE_OPERATIONS = [
    ("POST", "/serverless/v1/knowledge/retrieve"), ("POST", KNOWLEDGE), ("GET", KNOWLEDGE),
    ("GET", KNOWLEDGE + "/{knowledge_id}"), ("DELETE", KNOWLEDGE + "/{knowledge_id}"),
    ("POST", KNOWLEDGE + "/{knowledge_id}/document"), ("GET", KNOWLEDGE + "/{knowledge_id}/document"),
    ("POST", KNOWLEDGE + "/{knowledge_id}/document/upload"),
    ("DELETE", KNOWLEDGE + "/{knowledge_id}/document/{document_id}")]
ENDPOINT = "/dedicated/beta/endpoint"
ENDPOINT_OPERATIONS = [
    ("POST", "/dedicated/endpoint/wandb-artifact-create"), ("POST", ENDPOINT), ("GET", ENDPOINT),
    ("GET", ENDPOINT + "/{endpoint_id}"), ("PUT", ENDPOINT + "/{endpoint_id}"),
    ("DELETE", ENDPOINT + "/{endpoint_id}"), ("GET", ENDPOINT + "/{endpoint_id}/version"),
    ("GET", ENDPOINT + "/{endpoint_id}/status"),
    *[("PUT", f"{ENDPOINT}/{{endpoint_id}}/{op}") for op in ("sleep", "wake", "terminate", "restart")],
    *[("POST", "/dedicated" + path) for path in (
        "/v1/chat/completions", "/v1/chat/render", "/v1/messages", "/v1/completions",
        "/v1/embeddings", "/v1/tokenize", "/v1/detokenize", "/v1/images/generations",
        "/v1/images/edits", "/v1/audio/transcriptions", "/classify")]]


def test_the_document_covers_every_operation(api_schema, suite_process):
    import httpx
    doc = httpx.get(f"{suite_process.url}/openapi.json").json()
    listed = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert listed >= set(_operations())
    for method, path in _operations()[:20]:
        responses = doc["paths"][path][method.lower()]["responses"]
        assert {"401", "404", "422"} <= set(responses), (method, path)


@pytest.mark.parametrize("mode", ["positive", "negative"])
@pytest.mark.parametrize("method,path", _operations())
def test_no_input_is_a_server_error(api_schema, suite_process, method, path, mode):
    operation = api_schema[path][method]
    generation = GenerationMode.NEGATIVE if mode == "negative" else GenerationMode.POSITIVE
    seen: dict[int, int] = {}

    @hypothesis.given(case=operation.as_strategy(generation_mode=generation))
    @hypothesis.settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True,
                         database=None, suppress_health_check=list(hypothesis.HealthCheck),
                         phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate])
    def check(case):
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        if isinstance(case.headers, dict) and "X-Friendli-Team" in case.headers:
            headers["X-Friendli-Team"] = case.headers["X-Friendli-Team"]
        response = case.call_and_validate(base_url=suite_process.url, checks=CHECKS,
                                          headers=headers, timeout=30)
        seen[response.status_code] = seen.get(response.status_code, 0) + 1

    try:
        check()
    except hypothesis.errors.Unsatisfiable:
        if mode == "negative":
            pytest.skip(f"{method} {path} has no input that schemathesis can make invalid")
        raise
    print(f"{method} {path} {mode}: {seen}")
    assert seen and max(seen) < 500, seen
