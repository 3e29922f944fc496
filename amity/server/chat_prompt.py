"""From chat messages to prompt text and ids, through the model's own chat template.

Chat completions, /v1/chat/render and /v1/messages (after converting Anthropic blocks
to these dicts) all render here, so they agree on the prompt for the same conversation.
"""

import json
from dataclasses import dataclass

from jinja2 import TemplateError

from amity.server import schemas as s
from amity.server.chat_output import THINK_OPEN, tool_prompt
from amity.server.protocol import InvalidRequest, ModelInfo, check_prompt


@dataclass
class RenderedPrompt:
    text: str
    token_ids: list[int]
    # The template opened a `<think>` block for the model (e.g. Qwen3, DeepSeek-R1).
    starts_in_reasoning: bool


def text_of(content, loc: list, multimodal: bool = False) -> str:
    """A message's content as text. Parts other than text go to a text-only model only
    as a clear 422, not silently dropped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type != "text":
            raise InvalidRequest(
                f"this model reads text only and cannot take a {part.type!r} part; "
                "send the content as text",
                [*loc, j, "type"], type="not_supported",
            )
        texts.append(part.text)
    return "\n".join(texts)


def _arguments(raw: str):
    # Templates that render tool calls expect `arguments` as a mapping.
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def message_dicts(messages: list[s.Message]) -> list[dict]:
    out = []
    for i, m in enumerate(messages):
        d = {"role": m.role, "content": text_of(m.content, ["messages", i, "content"])}
        if getattr(m, "name", None):
            d["name"] = m.name
        if isinstance(m, s.AssistantMessage):
            if m.tool_calls:
                d["tool_calls"] = [
                    {"id": c.id, "type": "function",
                     "function": {"name": c.function.name,
                                  "arguments": _arguments(c.function.arguments)}}
                    for c in m.tool_calls
                ]
            if m.reasoning_content:
                d["reasoning_content"] = m.reasoning_content
        if isinstance(m, s.ToolMessage):
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def _without_native_tools(messages: list[dict], tools: list[dict] | None, template: str):
    """Templates that know nothing of tools (SmolLM2's) would drop them silently: put the
    tool list in the system prompt and past calls in the assistant text, in the Hermes
    format the output parser reads."""
    messages = [dict(m) for m in messages]
    if "tool_calls" not in template:
        for m in messages:
            if m.get("tool_calls"):
                calls = "\n".join(
                    "<tool_call>\n" + json.dumps(
                        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                        ensure_ascii=False) + "\n</tool_call>"
                    for c in m.pop("tool_calls"))
                m["content"] = (m["content"] + "\n" + calls).strip()
    if tools and "tools" not in template:
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = messages[0]["content"] + "\n\n" + tool_prompt(tools)
        else:
            messages.insert(0, {"role": "system", "content": tool_prompt(tools)})
        tools = None
    return messages, tools


def template_kwargs(explicit: dict | None, *, enable_thinking: bool | None = None,
                    reasoning_effort: str | None = None,
                    reasoning_budget: int | None = None) -> dict:
    """The variables a chat template renders with: the reasoning controls under the
    names reasoning models' templates read (Qwen3's `enable_thinking`, gpt-oss's
    `reasoning_effort`, `reasoning_budget`), then the request's own
    `chat_template_kwargs`, which win. A template that reads none of them ignores
    them: the controls only do what the model's template makes of them."""
    derived = {"enable_thinking": enable_thinking, "reasoning_effort": reasoning_effort,
               "reasoning_budget": reasoning_budget}
    return {k: v for k, v in derived.items() if v is not None} | (explicit or {})


def render(info: ModelInfo, messages: list[dict], tools: list[dict] | None,
           template_kwargs: dict | None) -> RenderedPrompt:
    tokenizer = info.tokenizer
    template = tokenizer.chat_template
    if not template:
        raise InvalidRequest(
            "this model has no chat template; use /v1/completions with a prompt instead",
            ["messages"], type="not_supported")
    messages, tools = _without_native_tools(messages, tools, template)
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, **(template_kwargs or {}))
    except (TemplateError, TypeError, ValueError, KeyError) as err:
        raise InvalidRequest(
            f"the model's chat template cannot render these messages: {err}", ["messages"]
        ) from None
    # The template writes its own special tokens (BOS, role markers).
    ids = tokenizer.encode(text, add_special_tokens=False)
    check_prompt(ids, info, ["messages"])
    return RenderedPrompt(text, ids, text.rstrip().endswith(THINK_OPEN))


def tool_dicts(tools: list[s.Tool] | None) -> list[dict] | None:
    if not tools:
        return None
    return [t.model_dump(exclude_none=True) for t in tools]
