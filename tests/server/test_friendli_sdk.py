"""The official `friendli` SDK's container client against our server: every operation,
streaming and not, parsed by the SDK's own models (a shape it rejects fails here)."""

import pytest
from friendli import SyncFriendli
from friendli.core.models.messageserrorresponse import MessagesErrorResponse
from friendli.core.utils.retries import RetryConfig

NO_RETRIES = RetryConfig("none", None, False)


@pytest.fixture(scope="module")
def client():
    # A token is set so the SDK sends `Authorization: Bearer`, which we must ignore.
    with SyncFriendli(token="not-checked", retry_config=NO_RETRIES, timeout_ms=120_000) as c:
        yield c.container


def test_completions(client, server):
    res = client.completions.complete(
        request={"prompt": "The sky is", "max_tokens": 6, "seed": 3}, server_url=server.url)
    assert type(res).__name__.endswith("CompletionsSuccess")  # parsed by the SDK's model
    choice = res.choices[0]
    assert choice.seed == 3 and len(choice.tokens) == res.usage.completion_tokens
    assert res.usage.prompt_tokens_details.cached_tokens is not None


def test_completions_stream(client, server):
    events = list(client.completions.complete(
        request={"tokens": [504, 6322, 314], "max_tokens": 5, "min_tokens": 5, "stream": True,
                 "stream_options": {"include_usage": True}},
        server_url=server.url))
    data = [e.data for e in events]
    assert all(d.OBJECT == "text_completion" for d in data)
    assert [d.choices[0].token is not None for d in data[:-2]] == [True] * (len(data) - 2)
    assert data[-2].choices[0].finish_reason == "length"  # min_tokens = max_tokens
    assert data[-1].choices == [] and data[-1].usage.prompt_tokens == 3
    assert data[-1].usage.completion_tokens == 5


def test_chat(client, server):
    res = client.chat.complete(
        messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, server_url=server.url)
    assert res.choices[0].message.role == "assistant"
    assert res.created > 0 and res.usage.completion_tokens > 0


def test_chat_stream(client, server):
    events = list(client.chat.complete(
        messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, stream=True,
        stream_options={"include_usage": True}, server_url=server.url))
    data = [e.data for e in events]
    assert data[0].choices[0].delta.role == "assistant"
    finish = [d for d in data if d.choices and d.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].delta is not None
    assert data[-1].usage is not None


def test_messages(client, server):
    ask = dict(messages=[{"role": "user", "content": "Say hello."}], system="Be brief.",
               temperature=0, server_url=server.url)
    res = client.messages.messages(max_tokens=1, **ask)
    assert res.stop_reason == "max_tokens" and res.usage.output_tokens == 1
    res = client.messages.messages(max_tokens=16, **ask)
    text = res.content[0].text
    # Greedy: it ends at EOS (end_turn, the EOS not counted as text) or at max_tokens.
    assert res.stop_reason == ("max_tokens" if res.usage.output_tokens == 16 else "end_turn")
    stop = text[1:3]
    cut = client.messages.messages(max_tokens=16, stop_sequences=["\x00never", stop], **ask)
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)
    assert cut.content[0].text == text[:text.index(stop)]


def test_messages_stream(client, server):
    events = list(client.messages.messages(
        messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, stream=True,
        server_url=server.url))
    kinds = [e.EVENT for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]


def test_messages_error_is_typed(client, server):
    with pytest.raises(MessagesErrorResponse) as err:
        client.messages.messages(messages=[{"role": "user", "content": "hi"}], max_tokens=-1,
                                 server_url=server.url)
    assert "max_tokens" in err.value.data.error.message


def test_tokenize_roundtrip(client, server):
    toks = client.token.tokenize(prompt="Hello there, world", server_url=server.url).tokens
    text = client.token.detokenize(tokens=toks, server_url=server.url).text
    assert text == "Hello there, world"
