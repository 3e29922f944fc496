"""Structured output (issue 5) over HTTP and through the `openai` and `anthropic` SDKs:
`response_format` in completions and chat, forced tool calls in chat and messages,
streaming and not; refused schemas and regexes are 422s and the server keeps serving."""

import json
import re

import jsonschema
import pytest

from tests.server.conftest import sse_data

SYSTEM = {"role": "system", "content": "You are an API generating valid JSON as output."}
ITEM = {
    "type": "object",
    "properties": {
        "item": {"type": "string", "maxLength": 12},
        "count": {"type": "integer", "minimum": 1, "maximum": 99},
        "unit": {"enum": ["kg", "g", "piece"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8},
                 "minItems": 1, "maxItems": 2},
    },
    "required": ["item", "count", "unit", "tags"],
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16},
                   "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 12}},
        "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                      "parameters": TIME}},
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_completions_json_schema_regex_and_object(http):
    prompt = "A shopping list entry as JSON: "
    formats = {
        "schema": {"type": "json_schema", "json_schema": {"name": "item", "schema": ITEM}},
        "regex": {"type": "regex", "schema": r"[A-Z][a-z]{2,8} (is|was) [0-9]{1,2}\."},
        "object": {"type": "json_object"},
    }
    for name, fmt in formats.items():
        res = http.post("/v1/completions", json={
            "prompt": prompt, "n": 6, "seed": 3, "temperature": 1.0, "max_tokens": 48,
            "response_format": fmt})
        assert res.status_code == 200, res.text
        stopped = [c["text"] for c in res.json()["choices"] if c["finish_reason"] == "stop"]
        assert len(stopped) >= 2, (name, res.json()["choices"])
        for text in stopped:
            if name == "schema":
                jsonschema.validate(json.loads(text), ITEM)
            elif name == "regex":
                assert re.fullmatch(fmt["schema"], text), text
            else:
                assert isinstance(json.loads(text), dict), text


def test_chat_json_schema_streaming_and_not(http):
    body = {"messages": [SYSTEM, {"role": "user", "content": "Describe a grocery item."}],
            "n": 4, "seed": 1, "temperature": 1.0, "max_tokens": 64,
            "response_format": {"type": "json_schema", "json_schema": {"schema": ITEM}}}
    res = http.post("/v1/chat/completions", json=body)
    assert res.status_code == 200, res.text
    texts = [c["message"]["content"] for c in res.json()["choices"] if c["finish_reason"] == "stop"]
    streamed: dict[int, str] = {}
    finish: dict[int, str] = {}
    res = http.post("/v1/chat/completions", json=body | {"stream": True})
    for data in sse_data(res.text):
        if data == "[DONE]":
            continue
        for c in json.loads(data)["choices"]:
            streamed[c["index"]] = streamed.get(c["index"], "") + (c["delta"].get("content") or "")
            if c["finish_reason"]:
                finish[c["index"]] = c["finish_reason"]
    texts += [streamed[i] for i, f in finish.items() if f == "stop"]
    assert len(texts) >= 2
    for text in texts:
        jsonschema.validate(json.loads(text), ITEM)


BAD = [
    ({"type": "json_schema", "json_schema": {"schema": {"type": "frobnicate"}}}, "frobnicate"),
    ({"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/nope"}}}, "nope"),
    ({"type": "json_schema", "json_schema": {"schema": {"not": {"type": "string"}}}}, "'not'"),
    ({"type": "regex", "schema": "(?=x)y"}, "lookahead"),
    ({"type": "regex", "schema": "(?<=x)y"}, "lookbehind"),
    ({"type": "regex", "schema": "^start"}, "`^`"),
    ({"type": "regex", "schema": r"\p{Lu}"}, r"`\p`"),
    ({"type": "regex", "schema": r"(a)\1"}, "back-reference"),
]


@pytest.mark.parametrize("fmt, words", BAD, ids=[w for _, w in BAD])
def test_refused_formats_are_422_and_the_server_keeps_serving(http, fmt, words):
    for path, body in [("/v1/completions", {"prompt": "x", "max_tokens": 4}),
                       ("/v1/chat/completions", {"messages": ASK, "max_tokens": 4})]:
        res = http.post(path, json=body | {"response_format": fmt})
        assert res.status_code == 422, res.text
        detail = res.json()["detail"]
        assert detail[0]["loc"] == ["body", "response_format"]
        assert words in detail[0]["msg"], detail
    res = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3})
    assert res.status_code == 200 and len(res.json()["choices"][0]["tokens"]) == 3


def test_tool_with_a_refused_schema_is_422(http):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "bogus"}}}]
    res = http.post("/v1/chat/completions", json={"messages": ASK, "tools": tools,
                                                  "tool_choice": "required", "max_tokens": 8})
    assert res.status_code == 422 and res.json()["detail"][0]["loc"] == ["body", "tools"]
    res = http.post("/v1/chat/completions", json={
        "messages": ASK, "tools": TOOLS, "max_tokens": 8,
        "tool_choice": {"type": "function", "function": {"name": "missing"}}})
    assert res.status_code == 422 and "missing" in res.json()["detail"][0]["msg"]


def _check_calls(calls, names: set[str], parallel: bool):
    assert calls and (parallel or len(calls) == 1)
    for call in calls:
        assert call.type == "function" and call.id and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_openai_sdk_forced_tool_calls(oai):
    cases = [("required", set(SCHEMAS), True),
             ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}, False)]
    for choice, names, parallel in cases:
        done = 0
        for seed in range(2):
            res = oai.chat.completions.create(
                model=None, messages=ASK, tools=TOOLS, tool_choice=choice, seed=seed,
                parallel_tool_calls=parallel, temperature=1.0, max_tokens=96)
            c = res.choices[0]
            if c.finish_reason == "length":
                continue
            assert c.finish_reason == "tool_calls", c
            assert not c.message.content
            _check_calls(c.message.tool_calls, names, parallel)
            done += 1
        assert done >= 1


def test_openai_sdk_forced_tool_calls_streaming(oai):
    done = 0
    for seed in range(4):
        stream = oai.chat.completions.create(
            model=None, messages=ASK, tools=TOOLS, seed=seed, temperature=1.0, max_tokens=96,
            tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True)
        calls: dict[int, dict] = {}
        finish = None
        for chunk in stream:
            for c in chunk.choices:
                for d in c.delta.tool_calls or []:
                    acc = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                    acc["id"] = acc["id"] or d.id
                    acc["name"] += d.function.name or ""
                    acc["arguments"] += d.function.arguments or ""
                finish = c.finish_reason or finish
        if finish == "length":
            continue
        assert finish == "tool_calls" and list(calls) == [0]  # a named choice is one call
        assert calls[0]["id"] and calls[0]["name"] == "get_weather"
        jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER)
        done += 1
    assert done >= 2


NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_a_named_tool_choice_is_one_call(oai):
    """Greedy SmolLM2 repeats calls while the grammar allows more: a named choice (with
    parallel calls allowed, the default) must still be exactly one call."""
    res = oai.chat.completions.create(model=None, messages=ASK, tools=TOOLS, tool_choice=NAMED,
                                      temperature=0, max_tokens=96)
    c = res.choices[0]
    assert c.finish_reason == "tool_calls" and c.message.content is None, c
    [call] = c.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def _array_never_closes(tokenizer) -> dict[str, int]:
    """A `logit_bias` that bans every token with a `]` in it: the forced call array can
    then never close, so whatever the model prefers, it writes call after call."""
    return {str(t): -100 for t in range(tokenizer.vocab_size) if "]" in tokenizer.decode([t])}


def _call_spans(text: str) -> list[tuple[int, int, dict]]:
    """(start, end, call) of each complete call in the text of an unclosed call array."""
    decoder, spans, i = json.JSONDecoder(), [], 1
    assert text.startswith("["), text
    while True:
        try:
            call, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return spans
        spans.append((i, end, call))
        if text[end:end + 1] != ",":
            return spans
        i = end + 1 + len(text[end + 1:]) - len(text[end + 1:].lstrip())


def test_calls_cut_by_max_tokens_keep_the_complete_ones(oai, engine):
    """Issue 13 (11): an array of calls that max_tokens cuts inside its second call
    returns the first call, complete, as `tool_calls` (not the raw JSON as content);
    the stream has sent both, the second as far as it was generated."""
    body = {"model": None, "messages": ASK, "tools": TOOLS, "tool_choice": "required",
            "temperature": 0, "logit_bias": _array_never_closes(engine.tokenizer)}
    # The greedy path, token by token, from the logprobs of a longer run.
    res = oai.chat.completions.create(**body, max_tokens=160, logprobs=True)
    assert res.choices[0].finish_reason == "length"
    pieces = [bytes(t.bytes).decode() for t in res.choices[0].logprobs.content]
    spans = _call_spans("".join(pieces))
    assert len(spans) >= 2, pieces
    first, (start, end, _) = spans[0][2], spans[1]
    # Cut inside the second call: the most tokens that still leave its closing `}}` out.
    max_tokens = max(k for k in range(len(pieces)) if len("".join(pieces[:k])) <= end - 2)

    c = oai.chat.completions.create(**body, max_tokens=max_tokens).choices[0]
    assert c.finish_reason == "length" and c.message.content is None, c
    [call] = c.message.tool_calls
    assert call.id and call.function.name == first["name"]
    assert json.loads(call.function.arguments) == first["arguments"]
    _check_calls(c.message.tool_calls, set(SCHEMAS), parallel=True)

    streamed: dict[int, str] = {}
    for chunk in oai.chat.completions.create(**body, max_tokens=max_tokens, stream=True):
        for d in (d for c in chunk.choices for d in c.delta.tool_calls or []):
            streamed[d.index] = streamed.get(d.index, "") + (d.function.arguments or "")
    assert list(streamed) == [0, 1] and json.loads(streamed[0]) == first["arguments"]
    assert streamed[1] and streamed[1] in "".join(pieces)[start:end], streamed  # as far as generated
    with pytest.raises(json.JSONDecodeError):
        json.loads(streamed[1])


def test_streamed_tool_call_arguments_arrive_in_fragments(oai, http):
    """The id and name first (arguments ""), then fragments that add up to the
    arguments of the same request unstreamed; the SDK's own accumulation agrees."""
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": NAMED, "temperature": 0,
            "max_tokens": 96}
    whole = oai.chat.completions.create(model=None, **body).choices[0].message.tool_calls[0]
    deltas = []
    for data in sse_data(http.post("/v1/chat/completions", json=body | {"stream": True}).text):
        if data != "[DONE]":
            for c in json.loads(data)["choices"]:
                deltas += c["delta"].get("tool_calls") or []
    first, rest = deltas[0], deltas[1:]
    assert first["id"] and first["type"] == "function" and first["index"] == 0
    assert first["function"] == {"name": "get_weather", "arguments": ""}
    assert len(rest) > 3 and all(d["index"] == 0 and d["id"] is None for d in rest)
    so_far = ""
    for d in rest:
        so_far += d["function"]["arguments"]
        assert whole.function.arguments.startswith(so_far)
    assert so_far == whole.function.arguments
    with oai.chat.completions.stream(model=None, **body) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    [call] = final.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", whole.function.arguments)


def _anthropic_tools():
    return [{"name": t["function"]["name"], "description": t["function"]["description"],
             "input_schema": t["function"]["parameters"]} for t in TOOLS]


def _check_tool_uses(msg, names, single):
    assert msg.stop_reason == "tool_use", msg
    uses = [b for b in msg.content if b.type == "tool_use"]
    assert uses and all(b.type == "tool_use" for b in msg.content)
    if single:
        assert len(uses) == 1
    for b in uses:
        assert b.name in names and b.id
        jsonschema.validate(b.input, SCHEMAS[b.name])


def _calls(msg):  # ids are fresh each time: what a message says is everything else
    return [(b.type, getattr(b, "name", None), getattr(b, "input", getattr(b, "text", None)))
            for b in msg.content]


def test_anthropic_sdk_forced_tool_use(claude, model_name):
    # This SDK version has no `temperature` or `seed` argument: both go as wire fields
    # (`seed` is our extension; the spec's Messages body allows additional properties).
    def create(choice, **sampling):
        return claude.messages.create(model=model_name, max_tokens=96, messages=ASK,
                                      tools=_anthropic_tools(), tool_choice=choice,
                                      extra_body=sampling)

    single = {"type": "any", "disable_parallel_tool_use": True}
    _check_tool_uses(create(single, temperature=0), set(SCHEMAS), single=True)
    # Greedy decoding repeats parallel calls until max_tokens with this small model, so the
    # parallel cases sample; a seed makes each try reproducible.
    for choice, names in [({"type": "any"}, set(SCHEMAS)),
                          ({"type": "tool", "name": "get_weather"}, {"get_weather"})]:
        msgs = [create(choice, temperature=1.0, seed=seed) for seed in range(6)]
        again = create(choice, temperature=1.0, seed=0)
        assert _calls(again) == _calls(msgs[0]) and again.stop_reason == msgs[0].stop_reason
        finished = [msg for msg in msgs if msg.stop_reason != "max_tokens"]
        assert finished, msgs
        for msg in finished:  # a named tool is one call
            _check_tool_uses(msg, names, single=choice["type"] == "tool")


def test_messages_output_config_json_schema(claude, model_name, http):
    msg = claude.messages.create(
        model=model_name, max_tokens=96, system=SYSTEM["content"],
        messages=[{"role": "user", "content": "A shopping list entry as JSON."}],
        extra_body={"temperature": 0,
                    "output_config": {"format": {"type": "json_schema", "schema": ITEM}}})
    assert msg.stop_reason == "end_turn", msg
    assert [b.type for b in msg.content] == ["text"]
    jsonschema.validate(json.loads(msg.content[0].text), ITEM)
    both = http.post("/v1/messages", json={
        "max_tokens": 8, "messages": ASK, "tools": _anthropic_tools(),
        "tool_choice": {"type": "any"},
        "output_config": {"format": {"type": "json_schema", "schema": ITEM}}})
    assert both.status_code == 422 and "output_config" in both.text, both.text
    refused = http.post("/v1/messages", json={
        "max_tokens": 8, "messages": ASK,
        "output_config": {"format": {"type": "json_schema", "schema": {"oneOf": [ITEM]}}}})
    assert refused.status_code == 422 and "output_config" in refused.text, refused.text


def test_anthropic_sdk_forced_tool_use_streaming(claude, model_name):
    """The tool_use block opens with its id and name, its input streams as
    input_json_delta fragments, and the SDK's accumulated message equals the
    unstreamed one."""
    kwargs = dict(model=model_name, max_tokens=128, messages=ASK, tools=_anthropic_tools(),
                  extra_body={"temperature": 0}, tool_choice={"type": "tool", "name": "get_time"})
    whole = claude.messages.create(**kwargs)
    _check_tool_uses(whole, {"get_time"}, single=True)
    with claude.messages.stream(**kwargs) as stream:
        events = list(stream)
        msg = stream.get_final_message()
    assert msg.stop_reason == "tool_use", msg
    [start] = [e for e in events if e.type == "content_block_start"]
    assert start.content_block.type == "tool_use" and start.content_block.name == "get_time"
    fragments = [e.delta.partial_json for e in events
                 if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    assert len(fragments) > 2 and json.loads("".join(fragments)) == whole.content[0].input
    assert _calls(msg) == _calls(whole)
