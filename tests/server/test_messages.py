"""/v1/messages semantics: `thinking` and its budget, reasoning controls reaching the
chat template, Anthropic's usage and stop reasons."""

import types
import uuid

import pytest
from transformers import AutoTokenizer

from amity.models.tokenizer import Tokenizer
from amity.server import messages_schemas as m
from amity.server import schemas as s
from amity.server.protocol import ModelInfo
from amity.server.routes import chat, messages

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("thinking, max_tokens, words", [
    ({"type": "enabled"}, 64, "budget_tokens"),
    ({"type": "enabled", "budget_tokens": 64}, 64, "below `max_tokens`"),
    ({"type": "enabled", "budget_tokens": 0}, 64, "budget_tokens"),
    ({"type": "disabled", "budget_tokens": 8}, 64, "no `budget_tokens`"),
    ({"type": "adaptive", "budget_tokens": 8}, 64, "no `budget_tokens`"),
])
def test_thinking_budget_is_checked(http, thinking, max_tokens, words):
    res = http.post("/v1/messages", json={"messages": HI, "max_tokens": max_tokens,
                                          "thinking": thinking})
    assert res.status_code == 422, res.text
    err = res.json()["error"]
    assert err["type"] == "invalid_request_error" and words in err["message"], err


def test_thinking_with_a_budget_below_max_tokens_is_served(http):
    res = http.post("/v1/messages", json={"messages": HI, "max_tokens": 4, "temperature": 0,
                                          "thinking": {"type": "enabled", "budget_tokens": 3}})
    assert res.status_code == 200, res.text
    assert res.json()["stop_reason"] == "max_tokens"


def test_input_tokens_do_not_count_the_cached_ones(http):
    """Anthropic: the prompt is input_tokens + cache_read_input_tokens."""
    system = "Remember these words: " + " ".join(uuid.uuid4().hex for _ in range(24))
    body = {"system": system, "messages": HI, "max_tokens": 1}
    first = http.post("/v1/messages", json=body).json()["usage"]
    again = http.post("/v1/messages", json=body).json()["usage"]
    assert first["cache_read_input_tokens"] == 0 and again["cache_read_input_tokens"] > 0
    assert again["input_tokens"] + again["cache_read_input_tokens"] == first["input_tokens"]
    chat_usage = http.post("/v1/chat/completions", json={
        "messages": [{"role": "system", "content": system}, *HI], "max_tokens": 1}).json()["usage"]
    assert chat_usage["prompt_tokens"] == first["input_tokens"]


@pytest.fixture(scope="module")
def echo_info(tiny_tokenizer_dir) -> ModelInfo:
    """A tokenizer whose template prints the reasoning variables it is given."""
    hf = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    hf.chat_template = ("{% for m in messages %}{{ m['content'] }}{% endfor %}|"
                        "{{ enable_thinking }}|{{ reasoning_effort }}|{{ reasoning_budget }}")
    return ModelInfo(Tokenizer(hf, set()), len(hf), 512)


def _rendered_tail(text: str) -> list[str]:
    return text.split("|")[1:]


@pytest.mark.parametrize("fields, expected", [
    ({}, ["", "", ""]),
    ({"thinking": {"type": "enabled", "budget_tokens": 16}}, ["True", "", "16"]),
    ({"thinking": {"type": "disabled"}}, ["False", "", ""]),
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "low"}}, ["", "low", ""]),
])
def test_messages_thinking_reaches_the_template(echo_info, fields, expected):
    body = m.MessagesBody(messages=HI, max_tokens=64, **fields)
    prompt, _, _ = messages.translate(body, types.SimpleNamespace(info=echo_info))
    assert _rendered_tail(prompt.text) == expected, prompt.text


def test_chat_reasoning_controls_reach_the_template(echo_info):
    body = s.ChatCompletionBody(messages=HI, reasoning_effort="high", reasoning_budget=100)
    request = chat.translate(body, types.SimpleNamespace(info=echo_info))
    assert _rendered_tail(request.prompt.text) == ["", "high", "100"]
    body = s.ChatCompletionBody(messages=HI, reasoning_effort="high",
                                chat_template_kwargs={"reasoning_effort": "low",
                                                      "enable_thinking": False})
    request = chat.translate(body, types.SimpleNamespace(info=echo_info))
    assert _rendered_tail(request.prompt.text) == ["False", "low", ""]  # explicit kwargs win


@pytest.mark.parametrize("finish, stop, expected", [
    ("stop", None, ("end_turn", None)),
    ("stop", "###", ("stop_sequence", "###")),
    ("stop", (5, 6), ("end_turn", None)),
    ("length", None, ("max_tokens", None)),
    ("tool_calls", None, ("tool_use", None)),
])
def test_anthropic_stop_reasons(finish, stop, expected):
    assert messages.anthropic_stop(finish, stop) == expected
