"""The chat output parser: fed in any chunking, it splits the same way."""

import json

import pytest

from amity.server.chat_output import ChoiceParser
from amity.server.tool_calls import ToolCall, fold_tool_calls

TOOLS = {"get_weather", "get_time"}


def run(text: str, chunk: int, **kw):
    """(reasoning, content, complete calls, every delta, cut call indexes)."""
    p = ChoiceParser(**{"parse_reasoning": False, "starts_in_reasoning": False, **kw})
    reasoning = content = ""
    deltas = []
    for i in range(0, len(text), chunk):
        piece = p.feed(text[i:i + chunk])
        reasoning, content = reasoning + piece.reasoning, content + piece.content
        deltas += piece.tool_calls or []
    tail = p.finish()
    deltas += tail.tool_calls or []
    calls: list[ToolCall] = []
    fold_tool_calls(calls, deltas)
    cut = tail.cut_tool_calls or []
    complete = [c for k, c in enumerate(calls) if k not in cut] or None
    return reasoning + tail.reasoning, content + tail.content, complete, deltas, cut


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1000])
def test_think_block_split_at_any_chunking(chunk):
    r, c, *_ = run("<think>step one</think>\n\nThe answer.", chunk, parse_reasoning=True)
    assert (r, c) == ("step one", "The answer.")


@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_prompt_opened_think(chunk):
    r, c, *_ = run("hmm</think>Done", chunk, parse_reasoning=True, starts_in_reasoning=True)
    assert (r, c) == ("hmm", "Done")


def test_no_think_is_all_content():
    assert run("<thin and more", 2, parse_reasoning=True)[:2] == ("", "<thin and more")


@pytest.mark.parametrize("chunk", [1, 5, 1000])
def test_hermes_tool_call(chunk):
    text = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    _, content, calls, _, _ = run(text, chunk, tool_names=TOOLS)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_two_hermes_calls_and_text_between(chunk):
    text = ('<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>\n'
            '<tool_call>\n{"arguments": {"city": "Oslo"}, "name": "get_weather"}\n</tool_call>\nDone.')
    _, content, calls, _, _ = run(text, chunk, tool_names=TOOLS)
    assert content == "Done."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_time", {"zone": "UTC"}), ("get_weather", {"city": "Oslo"})]


def test_bare_json_tool_call_and_parallel_off():
    text = json.dumps([{"name": "get_weather", "arguments": {"city": "A"}},
                       {"name": "get_weather", "parameters": {"city": "B"}}])
    _, content, calls, _, _ = run(text, 3, tool_names=TOOLS, parallel_tool_calls=False)
    assert content == "" and len(calls) == 1 and json.loads(calls[0].arguments) == {"city": "A"}
    _, content, calls, _, _ = run(text, 3, tool_names=TOOLS)
    assert content == "" and [json.loads(c.arguments) for c in calls] == [{"city": "A"}, {"city": "B"}]


def test_arguments_given_as_a_json_string():
    text = json.dumps({"name": "get_time", "arguments": json.dumps({"zone": "CET"})})
    _, content, calls, _, _ = run(text, 4, tool_names=TOOLS)
    assert content == "" and json.loads(calls[0].arguments) == {"zone": "CET"}


@pytest.mark.parametrize("text", [
    '{"name": "other", "arguments": {}}',  # names no offered tool
    '{"answer": 42, "name": "get_time"}',  # a key before the name: still no call at its end
    '[1, 2, 3]',
    '<tool_call>not json</tool_call>',
    '{"name": get_time}',
])
def test_json_that_is_no_call_stays_content(text):
    if text.startswith('{"answer"'):
        # Named late, but the object ends as a call of get_time with no arguments.
        _, content, calls, _, _ = run(text, 4, tool_names=TOOLS)
        assert content == "" and [(c.name, c.arguments) for c in calls] == [("get_time", "{}")]
        return
    for chunk in (1, 4, 1000):
        assert run(text, chunk, tool_names=TOOLS)[:3] == ("", text, None)


def test_plain_text_streams_without_tools():
    assert run("Hello <tool_call> world", 3)[:3] == ("", "Hello <tool_call> world", None)


ARGS = '{"city": "Paris \\"Nord\\" {x}", "days": [1, 2], "unit": "celsius"}'


@pytest.mark.parametrize("chunk", [1, 2, 5, 1000])
def test_arguments_stream_after_the_name(chunk):
    """The id and name come first, then fragments that are each a prefix of the final
    arguments, and add up to them."""
    text = '[{"name": "get_weather", "arguments": ' + ARGS + '}, {"name": "get_time", "arguments": {}}]'
    _, content, calls, deltas, cut = run(text, chunk, tool_names=TOOLS)
    assert content == "" and cut == []
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", ARGS), ("get_time", "{}")]
    first = deltas[0]
    assert first.index == 0 and first.id and first.name == "get_weather"
    assert first.arguments == ""  # the call is announced before its arguments
    for k, call in enumerate(calls):
        mine = [d for d in deltas if d.index == k]
        assert mine[0].id and mine[0].name == call.name
        assert all(d.id is None and d.name is None for d in mine[1:])
        so_far = ""
        for d in mine:
            so_far += d.arguments
            assert call.arguments.startswith(so_far)
        assert so_far == call.arguments
    if chunk == 1:
        assert len([d for d in deltas if d.index == 0]) > 10  # many fragments, not one


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_a_call_cut_by_max_tokens_leaves_the_complete_ones(chunk):
    text = ('[{"name": "get_time", "arguments": {"zone": "UTC"}}, '
            '{"name": "get_weather", "arguments": {"city": "Par')
    _, content, calls, deltas, cut = run(text, chunk, tool_names=TOOLS)
    assert content == "" and cut == [1]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_time", {"zone": "UTC"})]
    assert {d.index for d in deltas} == {0, 1}  # the stream has sent the cut call's start


def test_output_cut_before_the_first_name_is_content():
    text = '{"name": "get_wea'
    assert run(text, 3, tool_names=TOOLS)[:3] == ("", text, None)
