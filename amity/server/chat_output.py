"""Splitting a chat choice's generated text into reasoning, content and tool calls.

The same `ChoiceParser` runs for streaming and non-streaming responses (a non-stream
message is the fold of the pieces a stream would send, less a tool call that
max_tokens cut), so both always agree. It is incremental: it holds back only what
might still turn out to be a tag (`<think>`, `</think>`, `<tool_call>`) or a JSON
tool call not yet named, and releases it at `finish`; a named call's arguments
stream as they are generated (tool_calls.py).
"""

import json
from dataclasses import dataclass

from amity.server.tool_calls import ToolCallDelta, ToolCallStream, partial_suffix

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass
class Pieces:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallDelta] | None = None
    # On a choice's last pieces: the calls the output ended inside of (max_tokens),
    # which a complete response leaves out; a stream has sent what was generated.
    cut_tool_calls: list[int] | None = None

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def __add__(self, later: "Pieces") -> "Pieces":
        calls = (self.tool_calls or []) + (later.tool_calls or [])
        return Pieces(self.reasoning + later.reasoning, self.content + later.content,
                      calls or None, later.cut_tool_calls or self.cut_tool_calls)


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
                    keep = partial_suffix(self.buf, THINK_CLOSE)
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


class ChoiceParser:
    def __init__(self, *, parse_reasoning: bool, starts_in_reasoning: bool,
                 include_reasoning: bool = True, tool_names: set[str] | None = None,
                 parallel_tool_calls: bool = True):
        self._reasoning = _ReasoningSplitter(starts_in_reasoning) if parse_reasoning else None
        self._include_reasoning = include_reasoning
        self._tools = ToolCallStream(tool_names, parallel_tool_calls) if tool_names else None

    @property
    def made_tool_calls(self) -> bool:
        """At least one call finished (read once the choice has finished)."""
        return self._tools is not None and self._tools.made_calls

    def _route(self, reasoning: str, content: str) -> Pieces:
        calls = None
        if self._tools is not None:
            content, calls = self._tools.feed(content)
        return Pieces(reasoning if self._include_reasoning else "", content, calls or None)

    def feed(self, text: str) -> Pieces:
        if self._reasoning is None:
            return self._route("", text)
        return self._route(*self._reasoning.feed(text))

    def finish(self) -> Pieces:
        out = self._route(*self._reasoning.flush()) if self._reasoning else Pieces()
        if self._tools is not None:
            rest, cut = self._tools.finish()
            out.content += rest
            out.cut_tool_calls = cut or None
        return out


def tool_prompt(tools: list[dict]) -> str:
    """For chat templates that do not render `tools` themselves: the Hermes tool-use
    system prompt (as Qwen2.5 and Hermes models are trained on), whose
    `<tool_call>` output `ToolCallStream` reads back."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
