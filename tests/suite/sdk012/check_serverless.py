"""Run by tests/suite/tools/test_sdk_serverless.py under .venv-sdk012 (friendli==0.12.8,
whose `serverless.model` and `serverless.tool_assisted_chat` match the spec), against
a real `amity suite` process in front of a real container on the default model, over
real sockets. Not collected by the main run (see check_sdk.py).

Environment: SUITE_URL, SUITE_TOKEN, SUITE_MODEL.
"""

import json
import os

import pytest
from friendli import SyncFriendli
from friendli.core import models
from friendli.core.utils.retries import RetryConfig

URL, TOKEN, MODEL = os.environ["SUITE_URL"], os.environ["SUITE_TOKEN"], os.environ["SUITE_MODEL"]
NO_RETRIES = RetryConfig("none", None, False)
QUESTION = [{"role": "user", "content": "What is 150 * 1.60934? Use the calculator."}]
FORCED = {"model": MODEL, "messages": QUESTION, "tools": [{"type": "math:calculator"}],
          "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0,
          "max_tokens": 40}


@pytest.fixture
def client():
    with SyncFriendli(token=TOKEN, server_url=URL, retry_config=NO_RETRIES,
                      timeout_ms=600_000) as c:
        yield c


def test_model_list(client):
    listed = client.serverless.model.list()
    by_id = {m.id: m for m in listed.data}
    assert MODEL in by_id
    smol = by_id[MODEL]
    assert smol.functionality.builtin_tool is True and smol.pricing.unit_type == "TOKEN"
    assert smol.policy is None and smol.context_length > 0


def test_tool_assisted_complete(client):
    result = client.serverless.tool_assisted_chat.complete(**FORCED)
    choice = result.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert "241.4" in choice.message.content
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens


def test_tool_assisted_stream(client):
    events = list(client.serverless.tool_assisted_chat.stream(**FORCED))
    statuses = [e.data for e in events if isinstance(e, models.StreamedToolAssistedChatToolStatus)]
    assert [s.status for s in statuses[:2]] == ["STARTED", "ENDED"]
    assert statuses[0].name == "math:calculator"
    assert [(p.name, p.value) for p in statuses[0].parameters] == [("expression", "150 * 1.60934")]
    assert json.loads(statuses[1].result) == {"result": "150 * 1.60934=241.401000000000"}
    tokens = [e.data for e in events if isinstance(e, models.StreamedToolAssistedChatToken)]
    text = "".join(t.choices[0].delta.content or "" for t in tokens if t.choices)
    assert "241.4" in text
    assert tokens[-1].choices[0].finish_reason in ("stop", "length")


def test_unknown_model_is_a_404(client):
    with pytest.raises(models.SDKError) as error:
        client.serverless.tool_assisted_chat.complete(**{**FORCED, "model": "nobody/nothing"})
    assert error.value.status_code == 404
