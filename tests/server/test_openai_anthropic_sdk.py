"""The `openai` and `anthropic` SDKs, unchanged, against our server."""

import anthropic
import openai
import pytest


def test_completions_n_and_logprobs(oai, model_name):
    res = oai.completions.create(model=model_name, prompt="Once upon a time", max_tokens=5, n=2,
                                 logprobs=3, seed=7)
    assert sorted(c.index for c in res.choices) == [0, 1]
    for c in res.choices:
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == 5
        assert all(len(top) <= 3 for top in c.logprobs.top_logprobs)
    assert res.usage.completion_tokens == 10


def test_completions_prompt_list_indexes_as_openai(oai):
    res = oai.completions.create(model=None, prompt=["Red", "Blue"], max_tokens=3, n=2, seed=1)
    assert sorted(c.index for c in res.choices) == [0, 1, 2, 3]


def test_completions_stream(oai, model_name):
    chunks = list(oai.completions.create(model=model_name, prompt="Hello", max_tokens=4, stream=True,
                                         temperature=0, extra_body={"min_tokens": 4}))
    assert chunks[-1].choices[0].finish_reason == "length"  # min_tokens = max_tokens
    stop = "".join(c.choices[0].text for c in chunks)[1:3]
    cut = list(oai.completions.create(model=model_name, prompt="Hello", max_tokens=4, stream=True,
                                      temperature=0, stop=[stop]))
    assert cut[-1].choices[0].finish_reason == "stop"


def test_chat_and_stream(oai, model_name):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    res = oai.chat.completions.create(model=None, messages=msgs, max_tokens=6, logprobs=True,
                                      top_logprobs=2)
    assert res.choices[0].logprobs.content and len(res.choices[0].logprobs.content[0].top_logprobs) == 2
    stream = oai.chat.completions.create(model=model_name, messages=msgs, max_tokens=6, stream=True,
                                         stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage.completion_tokens > 0


def test_chat_tools_accepted_and_rendered(oai, http, model_name):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    res = oai.chat.completions.create(model=model_name, messages=msgs, tools=tools, max_tokens=30, temperature=0)
    choice = res.choices[0]
    # Greedy: a call is `tool_calls`; text ends at EOS (`stop`) or at max_tokens (`length`).
    expected = ("tool_calls" if choice.message.tool_calls
                else "length" if res.usage.completion_tokens == 30 else "stop")
    assert choice.finish_reason == expected
    # SmolLM2's template ignores `tools`; they must still reach the model's prompt.
    text = http.post("/v1/chat/render", json={"messages": msgs, "tools": tools}).json()["text"]
    assert "get_weather" in text and "<tool_call>" in text


def test_unknown_model_is_404(oai):
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="no-such-model", prompt="x", max_tokens=1)


def test_anthropic_messages(claude, model_name):
    ask = dict(model=model_name, system="Be brief.", extra_body={"temperature": 0},
               messages=[{"role": "user", "content": "Hi"}])
    res = claude.messages.create(max_tokens=1, **ask)
    assert res.stop_reason == "max_tokens" and res.usage.output_tokens == 1
    res = claude.messages.create(max_tokens=24, **ask)
    assert res.stop_reason == ("max_tokens" if res.usage.output_tokens == 24 else "end_turn")
    stop = res.content[0].text[1:3]
    cut = claude.messages.create(max_tokens=24, stop_sequences=[stop], **ask)
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", stop)


def test_anthropic_stream_matches_final_message(claude, model_name):
    with claude.messages.stream(model=model_name, max_tokens=8,
                                messages=[{"role": "user", "content": "Hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].text == text
    assert final.usage.output_tokens > 0


def test_anthropic_bad_request_is_typed(claude, model_name):
    with pytest.raises(anthropic.UnprocessableEntityError):
        claude.messages.create(model=model_name, max_tokens=4, messages=[])
