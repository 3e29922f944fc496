"""The tool loop end to end: a real `amity suite` app (in process) in front of a real
container (`amity serve` on the default model, a subprocess on a real socket). The
135M default model does not call tools by itself, so these tests force the first
call through `tool_choice` (the container's grammar); the model then answers."""

import json

import httpx
import pytest

from tests.suite.conftest import start_in_process
from tests.suite.flows import upload
from tests.suite.tools.sse import read_events

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"
CHAT = "/serverless/tools/v1/chat/completions"
# Worded so that the default model's forced call is clean (for "Use the calculator." it
# writes "150 * 1.60934}}, " into the expression under the auto quantization default).
QUESTION = [{"role": "user", "content": "What is 150 * 1.60934? Use the calculator tool."}]
# A container starts (10-15 s alone) and each test runs several model turns.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def suite(smol_container, tmp_path_factory):
    return start_in_process(tmp_path_factory.mktemp("suite") / "data",
                            serverless_model_urls=f"{SMOL}={smol_container.url}")


def request(**extra):
    return {"model": SMOL, "messages": QUESTION, "tools": [{"type": "math:calculator"}],
            "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0,
            "max_tokens": 40, **extra}


def stream(suite, headers=None, **extra):
    with suite.client.stream("POST", CHAT, json=request(**extra),
                             headers={**suite.admin.headers, **(headers or {})}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return read_events(response.iter_lines())


def test_forced_calculator_call_streams_tool_status_then_the_answer(suite):
    events = stream(suite, stream=True, stream_options={"include_usage": True})
    assert events[-1] == (None, "[DONE]")
    statuses = [data for name, data in events if name == "tool_status"]
    started, ended = statuses[0], statuses[1]
    assert started["status"] == "STARTED" and started["name"] == "math:calculator"
    assert started["parameters"] == [{"name": "expression", "value": "150 * 1.60934"}]
    assert ended["status"] == "ENDED" and ended["tool_call_id"] == started["tool_call_id"]
    assert json.loads(ended["result"]) == {"result": "150 * 1.60934=241.401000000000"}
    assert isinstance(ended["timestamp"], float) and ended["error"] is None
    # All tool events come before the answer; the answer then streams and finishes.
    first_chunk = next(i for i, (name, _) in enumerate(events) if name is None)
    assert all(name is None for name, _ in events[first_chunk:])
    chunks = [data for name, data in events[:-1] if name is None]
    answer = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert "241.4" in answer
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] in ("stop", "length") and finishes.count(None) == len(finishes) - 1
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["model"] == SMOL
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    # Summed over the two turns: more prompt tokens than the question alone costs.
    alone = httpx.post(f"{suite.client.app.state.serverless_model_urls[SMOL]}/v1/chat/completions",
                       json={"messages": QUESTION, "max_tokens": 1}, timeout=120).json()
    assert usage["prompt_tokens"] > 2 * alone["usage"]["prompt_tokens"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_plain_response_is_the_same_answer_with_summed_usage(suite):
    streamed = stream(suite, stream=True)
    text = "".join(d["choices"][0]["delta"].get("content") or "" for n, d in streamed[:-1]
                   if n is None and d["choices"])
    response = suite.client.post(CHAT, json=request(), headers=suite.admin.headers)
    assert response.status_code == 200, response.text
    out = response.json()
    assert out["object"] == "chat.completion" and out["model"] == SMOL
    (choice,) = out["choices"]
    assert choice["message"]["content"] == text  # greedy: the same answer either way
    assert choice["finish_reason"] in ("stop", "length")
    assert out["usage"]["prompt_tokens"] > 0


def test_accept_header_alone_asks_for_a_stream(suite):
    events = stream(suite, headers={"Accept": "text/event-stream"}, tool_choice="none",
                    max_tokens=3)
    assert events[-1] == (None, "[DONE]") and all(name is None for name, _ in events)


def test_a_user_function_ends_the_turn(suite):
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
    body = request(tools=[{"type": "math:calculator"}, weather],
                   tool_choice={"type": "function", "function": {"name": "get_weather"}},
                   messages=[{"role": "user", "content": "Weather in Paris?"}])
    out = suite.client.post(CHAT, json=body, headers=suite.admin.headers).json()
    (choice,) = out["choices"]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and "city" in json.loads(call["function"]["arguments"])
    with suite.client.stream("POST", CHAT, json={**body, "stream": True},
                             headers=suite.admin.headers) as response:
        events = read_events(response.iter_lines())
    assert not [e for e in events if e[0] == "tool_status"]
    calls = [d["choices"][0]["delta"]["tool_calls"] for n, d in events[:-1]
             if d["choices"] and d["choices"][0]["delta"].get("tool_calls")]
    assert calls[0][0]["function"]["name"] == "get_weather"
    assert events[-2][1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_tool_error_stops_the_response_unless_resume_generation(suite):
    theirs = upload(suite.client, suite.other, b"another team's notes", "theirs.txt")
    body = request(tools=[{"type": "file:text", "files": [theirs]}],
                   messages=[{"role": "user", "content": "Summarize the file."}])
    events = stream(suite, **body, stream=True)
    statuses = [d for n, d in events if n == "tool_status"]
    assert [s["status"] for s in statuses] == ["STARTED", "ERRORED"]
    assert statuses[1]["error"]["type"] == "file_not_found" and statuses[1]["name"] == "file:text"
    assert events[-2][1]["choices"][0]["finish_reason"] == "stop" and events[-1][1] == "[DONE]"
    plain = suite.client.post(CHAT, json=body, headers=suite.admin.headers)
    assert plain.status_code == 422 and "resume_generation" in plain.text
    resumed = stream(suite, **body, stream=True, resume_generation=True)
    assert [d["status"] for n, d in resumed if n == "tool_status"][:2] == ["STARTED", "ERRORED"]
    answer = [d for n, d in resumed[:-1] if n is None and d["choices"]]
    assert answer and answer[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert suite.client.post(CHAT, json={**body, "resume_generation": True},
                             headers=suite.admin.headers).status_code == 200


def test_the_containers_refusal_of_the_first_turn_is_the_status(suite):
    for stream_field in (False, True):
        response = suite.client.post(CHAT, json=request(temperature=-1, stream=stream_field),
                                     headers=suite.admin.headers)
        assert response.status_code == 422, response.text
        assert "temperature" in response.text
