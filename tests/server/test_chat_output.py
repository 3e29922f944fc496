"""The chat output parser: fed in any chunking, it splits the same way."""

import json

import pytest

from amity.server.chat_output import ChoiceParser, parse_tool_calls

TOOLS = {"get_weather"}


def run(text: str, chunk: int, **kw):
    p = ChoiceParser(**{"parse_reasoning": False, "starts_in_reasoning": False, **kw})
    reasoning = content = ""
    for i in range(0, len(text), chunk):
        piece = p.feed(text[i:i + chunk])
        reasoning, content = reasoning + piece.reasoning, content + piece.content
    tail = p.finish()
    return reasoning + tail.reasoning, content + tail.content, tail.tool_calls


@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1000])
def test_think_block_split_at_any_chunking(chunk):
    r, c, _ = run("<think>step one</think>\n\nThe answer.", chunk, parse_reasoning=True)
    assert (r, c) == ("step one", "The answer.")


@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_prompt_opened_think(chunk):
    r, c, _ = run("hmm</think>Done", chunk, parse_reasoning=True, starts_in_reasoning=True)
    assert (r, c) == ("hmm", "Done")


def test_no_think_is_all_content():
    assert run("<thin and more", 2, parse_reasoning=True)[:2] == ("", "<thin and more")


@pytest.mark.parametrize("chunk", [1, 5, 1000])
def test_hermes_tool_call(chunk):
    text = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    _, content, calls = run(text, chunk, tool_names=TOOLS)
    assert content == "Let me check."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_bare_json_tool_call_and_parallel_off():
    text = json.dumps([{"name": "get_weather", "arguments": {"city": "A"}},
                       {"name": "get_weather", "parameters": {"city": "B"}}])
    _, content, calls = run(text, 3, tool_names=TOOLS, parallel_tool_calls=False)
    assert content == "" and len(calls) == 1


def test_json_naming_no_tool_stays_content():
    text = '{"name": "other", "arguments": {}}'
    assert run(text, 4, tool_names=TOOLS) == ("", text, None)
    assert parse_tool_calls("<tool_call>not json</tool_call>", TOOLS)[0] == []


def test_plain_text_streams_without_tools():
    assert run("Hello <tool_call> world", 3) == ("", "Hello <tool_call> world", None)
