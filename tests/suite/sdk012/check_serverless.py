"""Run by tests/suite/tools/test_sdk_serverless.py under .venv-sdk012 (friendli==0.12.8,
whose `serverless` operations match the spec), against a real `amity suite` process
that starts the catalog models' replicas itself (the default model, whisper-tiny.en),
over real sockets: the catalog, the 10 serverless inference operations and
tool-assisted chat. Not collected by the main run (see check_sdk.py).

Environment: SUITE_URL, SUITE_TOKEN, SUITE_MODEL, SUITE_WHISPER, SPEECH_WAV (a
recording of "Yesterday we walked to the park ...").
"""

import json
import os

import pytest
from friendli import SyncFriendli
from friendli.core import models
from friendli.core.utils.retries import RetryConfig

URL, TOKEN, MODEL = os.environ["SUITE_URL"], os.environ["SUITE_TOKEN"], os.environ["SUITE_MODEL"]
WHISPER, SPEECH_WAV = os.environ["SUITE_WHISPER"], os.environ["SPEECH_WAV"]
MESSAGES = [{"role": "user", "content": "Hi"}]
NO_RETRIES = RetryConfig("none", None, False)
# The default model writes a clean call for this wording (for "Use the calculator." it now
# writes "150 * 1.60934}}, " into the expression, under the auto quantization default).
QUESTION = [{"role": "user", "content": "What is 150 * 1.60934? Use the calculator tool."}]
FORCED = {"model": MODEL, "messages": QUESTION, "tools": [{"type": "math:calculator"}],
          "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0,
          "max_tokens": 40}


@pytest.fixture(scope="module")
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


def test_chat_complete_and_stream(client):
    chat = client.serverless.chat.complete(model=MODEL, messages=MESSAGES, max_tokens=3)
    assert chat.model == MODEL and chat.choices[0].message.content
    # no `stream` in the body: the SDK's Accept header asks for the stream
    streamed = list(client.serverless.chat.stream(model=MODEL, messages=MESSAGES, max_tokens=3))
    assert streamed and all(e.data.model == MODEL for e in streamed)
    assert streamed[-1].data.choices[0].finish_reason == "length"


def test_completions_complete_and_stream(client):
    done = client.serverless.completions.complete(serverless_completions_body={
        "model": MODEL, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0})
    assert done.model == MODEL and done.usage.completion_tokens == 3
    chunks = list(client.serverless.completions.stream(serverless_completions_stream_body={
        "model": MODEL, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}))
    assert "".join(c.data.choices[0].text for c in chunks if c.data.choices) == done.choices[0].text


def test_messages_render_and_tokens(client):
    answer = client.serverless.messages.messages(model=MODEL, messages=MESSAGES, max_tokens=3)
    assert answer.model == MODEL and answer.usage.output_tokens == 3
    rendered = client.serverless.chat_render.render(model=MODEL, messages=MESSAGES)
    assert "Hi" in rendered.text
    tokens = client.serverless.token.tokenize(model=MODEL, prompt="Hello world").tokens
    assert len(tokens) >= 2
    assert client.serverless.token.detokenize(model=MODEL, tokens=tokens).text == "Hello world"


def test_audio_transcriptions_plain_and_streamed(client):
    with open(SPEECH_WAV, "rb") as f:
        audio = f.read()
    result = client.serverless.audio.transcribe(model=WHISPER,
                                                file={"file_name": "park.wav", "content": audio})
    assert "park" in result.text and "children" in result.text
    # no `stream` field: the Accept header of stream() asks for the events
    events = [e.data for e in client.serverless.audio.stream(
        model=WHISPER, file={"file_name": "park.wav", "content": audio})]
    done = [e for e in events if e.type == "transcript.text.done"]
    assert len(done) == 1 and done[0].text == result.text
    assert "".join(e.delta for e in events if e.type == "transcript.text.delta") == result.text


def test_unknown_model_is_a_404_on_inference(client):
    with pytest.raises(models.SDKError) as error:
        client.serverless.chat.complete(model="nobody/nothing", messages=MESSAGES, max_tokens=3)
    assert error.value.status_code == 404 and "catalog" in error.value.body
