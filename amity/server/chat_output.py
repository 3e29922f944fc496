"""Splitting a chat choice's generated text into reasoning, content and tool calls.

The same `ChoiceParser` runs for streaming and non-streaming responses (a non-stream
message is the fold of the pieces a stream would send), so both always agree. It is
incremental: it holds back only what might still turn out to be a tag (`<think>`,
`</think>`, `<tool_call>`) or a bare-JSON tool call, and releases it at `finish`.
"""

import json
import re
import uuid
from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN = "<tool_call>"
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text


@dataclass
class Pieces:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] | None = None

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class _ReasoningSplitter:
    """Only a leading `<think>...</think>` block counts as reasoning (or, when the prompt
    already opened `<think>`, everything up to `</think>`)."""

    def __init__(self, starts_inside: bool):
        self.state = "reasoning" if starts_inside else "start"
        self.buf = ""

    def feed(self, text: str) -> tuple[str, str]:
        self.buf += text
        reasoning = content = ""
        while True:
            if self.state == "start":
                stripped = self.buf.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self.buf, self.state = stripped[len(THINK_OPEN):], "reasoning"
                elif THINK_OPEN.startswith(stripped):
                    return reasoning, content  # maybe a `<think>` still arriving
                else:
                    self.state = "content"
            elif self.state == "reasoning":
                end = self.buf.find(THINK_CLOSE)
                if end >= 0:
                    reasoning += self.buf[:end]
                    self.buf, self.state = self.buf[end + len(THINK_CLOSE):], "after"
                else:
                    keep = _partial_suffix(self.buf, THINK_CLOSE)
                    reasoning += self.buf[: len(self.buf) - keep]
                    self.buf = self.buf[len(self.buf) - keep:]
                    return reasoning, content
            elif self.state == "after":
                # The newlines after `</think>` separate; they are not the answer's.
                self.buf = self.buf.lstrip("\n")
                if not self.buf:
                    return reasoning, content
                self.state = "content"
            else:
                content, self.buf = content + self.buf, ""
                return reasoning, content

    def flush(self) -> tuple[str, str]:
        rest, self.buf = self.buf, ""
        return (rest, "") if self.state == "reasoning" else ("", rest)


def parse_tool_calls(text: str, tool_names: set[str]) -> tuple[list[ToolCall], str]:
    """Hermes-style `<tool_call>{json}</tool_call>` blocks, or the whole text as a bare
    JSON call (or list of calls). Returns the calls and the text outside them; a call
    naming no offered tool is not a call, so plain JSON answers stay content."""
    if TOOL_OPEN in text:
        raw_calls = _HERMES.findall(text)
        leftover = _HERMES.sub("", text)
    else:
        raw_calls, leftover = [text.strip()], ""
    calls = []
    for raw in raw_calls:
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            return [], text
        for item in obj if isinstance(obj, list) else [obj]:
            if not isinstance(item, dict) or item.get("name") not in tool_names:
                return [], text
            args = item.get("arguments", item.get("parameters", {}))
            if not isinstance(args, str):
                args = json.dumps(args, ensure_ascii=False)
            calls.append(ToolCall(f"call_{uuid.uuid4().hex[:24]}", item["name"], args))
    return calls, leftover.strip()


class _ToolCallBuffer:
    def __init__(self, tool_names: set[str], parallel: bool):
        self.tool_names = tool_names
        self.parallel = parallel
        self.state = "undecided"
        self.buf = ""

    def feed(self, text: str) -> str:
        self.buf += text
        if self.state == "undecided":
            stripped = self.buf.lstrip()
            if not stripped or TOOL_OPEN.startswith(stripped):
                return ""
            if stripped.startswith(TOOL_OPEN) or stripped[0] in "{[":
                self.state = "held"
                return ""
            self.state = "text"
        if self.state == "text":
            start = self.buf.find(TOOL_OPEN)
            if start >= 0:
                out, self.buf, self.state = self.buf[:start], self.buf[start:], "held"
                return out
            keep = _partial_suffix(self.buf, TOOL_OPEN)
            out, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep:]
            return out
        return ""

    def finish(self) -> tuple[str, list[ToolCall]]:
        rest, self.buf = self.buf, ""
        if self.state == "text" or not rest.strip():
            return rest, []
        calls, leftover = parse_tool_calls(rest, self.tool_names)
        if not calls:
            return rest, []
        if not self.parallel:
            calls = calls[:1]
        return leftover, calls


class ChoiceParser:
    def __init__(self, *, parse_reasoning: bool, starts_in_reasoning: bool,
                 include_reasoning: bool = True, tool_names: set[str] | None = None,
                 parallel_tool_calls: bool = True):
        self._reasoning = _ReasoningSplitter(starts_in_reasoning) if parse_reasoning else None
        self._include_reasoning = include_reasoning
        self._tools = _ToolCallBuffer(tool_names, parallel_tool_calls) if tool_names else None
        self.made_tool_calls = False

    def _route(self, reasoning: str, content: str) -> Pieces:
        if self._tools is not None:
            content = self._tools.feed(content)
        return Pieces(reasoning if self._include_reasoning else "", content)

    def feed(self, text: str) -> Pieces:
        if self._reasoning is None:
            return self._route("", text)
        return self._route(*self._reasoning.feed(text))

    def finish(self) -> Pieces:
        out = self._route(*self._reasoning.flush()) if self._reasoning else Pieces()
        if self._tools is not None:
            rest, calls = self._tools.finish()
            out.content += rest
            if calls:
                out.tool_calls = calls
                self.made_tool_calls = True
        return out


def tool_prompt(tools: list[dict]) -> str:
    """For chat templates that do not render `tools` themselves: the Hermes tool-use
    system prompt (as Qwen2.5 and Hermes models are trained on), whose
    `<tool_call>` output `parse_tool_calls` reads back."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
