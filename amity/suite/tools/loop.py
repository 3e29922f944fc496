"""The tool-assisted chat loop: the model (a container's `/v1/chat/completions`,
over HTTP, streamed) is offered the requested built-in tools as functions; when it
calls them, the Suite runs them, appends the calls and their results to the
conversation, and asks again, until the model answers.

- Built-in tools reach the model under valid function names (`math_calculator`);
  the events keep Friendli's names (`math:calculator`).
- A turn that calls a user `function` tool ends the response with
  `finish_reason: tool_calls` and those calls, as plain chat does (the client runs
  them); built-in calls made in that same turn are dropped, not run.
- `tool_choice` applies to the first turn (a forced call is the container's grammar);
  later turns are `auto`.
- The answer turn: when the model repeats a built-in call it made before (same tool,
  same arguments), or after MAX_TOOL_ROUNDS rounds of calls, the repeated call is not
  run and the model is asked once more, with no tools, for an answer: the client's
  messages, then a user message listing each call made and its result and asking
  for the answer (ANSWER_PROMPT). Small models repeat calls after their results:
  Qwen2.5-Coder-0.5B does in every tool-message shape tried, and, given the tool
  exchange in its own template's form with tools withdrawn, writes the call again
  as text; given the results as plain text it answers. Agent frameworks end a
  stuck loop the same way (smolagents' final answer step: the memory, then "Based on
  the above, please provide an answer to the following user task").
- A failed tool call stops the response unless `resume_generation` is set; with it,
  the error goes back to the model, and more than MAX_ERRORS failures stop it anyway.
- Usage is the sum over the turns.

The loop yields `("tool_status", event)` and `("chunk", chunk)` in order and fills
in a LoopOutcome; the route renders them as a stream or as one response.
"""

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from amity.suite.tools.base import BuiltinTool, ToolContext, ToolError, ToolOutput

MAX_TOOL_ROUNDS = 8
MAX_ERRORS = 8  # "if the system fails more than 8 times, the generation will stop"
TOOL_WAIT_S = 120.0  # each tool bounds itself; this is the loop's own backstop
ANSWER_PROMPT = "Tool results:\n{results}\n\nAnswer the question above using these results."


class ContainerError(Exception):
    """The container refused a turn (`status`, its body) or could not be reached (502)."""

    def __init__(self, status: int, detail):
        super().__init__(str(detail))
        self.status, self.detail = status, detail


@dataclass
class LoopRequest:
    model: str  # the catalog id, shown in every chunk
    messages: list[dict]
    builtin: list[BuiltinTool]
    functions: list[dict]  # the user's `function` tools, as chat takes them
    tool_choice: object  # "auto" | "none" | "required" | {"type": "function", ...}, function names mapped
    resume_generation: bool
    fields: dict  # everything else the container's chat takes (sampling, ...)
    context: ToolContext


@dataclass
class LoopOutcome:
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # user calls that end the turn
    finish_reason: str | None = None
    usage: dict = field(default_factory=lambda: {"prompt_tokens": 0, "completion_tokens": 0,
                                                 "total_tokens": 0})
    failed_tool: dict | None = None  # the ERRORED event that stopped the response


@dataclass
class _Turn:
    content: str = ""
    reasoning: str = ""
    calls: list[dict] = field(default_factory=list)  # {id, name, arguments}
    finish_reason: str | None = None


def _canonical(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except json.JSONDecodeError:
        return arguments


def parameters_of(arguments: dict) -> list[dict]:
    """tool_status `parameters`: every value a string."""
    return [{"name": k, "value": v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}
            for k, v in arguments.items()]


def tool_status(call_id: str, tool: BuiltinTool, status: str, parameters: list[dict],
                **extra) -> dict:
    return {"tool_call_id": call_id, "name": tool.type, "status": status,
            "parameters": parameters, "result": None, "files": None, "message": None,
            "error": None, "usage": None, "timestamp": time.time(), **extra}


class ToolLoop:
    def __init__(self, http: httpx.AsyncClient, base_url: str, request: LoopRequest):
        self.http, self.url = http, base_url.rstrip("/") + "/v1/chat/completions"
        self.request = request
        self.outcome = LoopOutcome()
        self.builtin = {t.function_name: t for t in request.builtin}
        self._role_sent = False

    def chunk(self, delta: dict, finish_reason=None, logprobs=None) -> dict:
        if not self._role_sent:
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        return {"id": self.outcome.id, "object": "chat.completion.chunk",
                "created": self.outcome.created, "model": self.request.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                             "logprobs": logprobs}]}

    def _tools(self, choice) -> list[dict] | None:
        if choice == "none":
            return None
        offered = [{"type": "function", "function": {
            "name": t.function_name, "description": t.description, "parameters": t.parameters}}
            for t in self.request.builtin]
        return offered + self.request.functions or None

    async def run(self) -> AsyncIterator[tuple[str, dict]]:
        messages = list(self.request.messages)
        choice, errors, rounds = self.request.tool_choice, 0, 0
        made: set[tuple[str, str]] = set()
        results: list[str] = []  # each call run, "name arguments -> result", for the answer turn
        while True:
            turn = _Turn()
            async for item in self._turn(messages, choice, turn):
                yield item
            out = self.outcome
            out.content += turn.content
            out.reasoning += turn.reasoning
            builtin = [c for c in turn.calls if c["name"] in self.builtin]
            user = [c for c in turn.calls if c["name"] not in self.builtin]
            if user:
                out.tool_calls = [{"id": c["id"], "type": "function",
                                   "function": {"name": c["name"], "arguments": c["arguments"]}}
                                  for c in user]
                yield "chunk", self.chunk({"tool_calls": [
                    {"index": i, **call} for i, call in enumerate(out.tool_calls)]})
                out.finish_reason = "tool_calls"
                yield "chunk", self.chunk({}, "tool_calls")
                return
            if not builtin or choice == "none":  # no tools were offered: the turn is the answer
                out.finish_reason = turn.finish_reason or "stop"
                yield "chunk", self.chunk({}, out.finish_reason)
                return
            keys = [(c["name"], _canonical(c["arguments"])) for c in builtin]
            if rounds == MAX_TOOL_ROUNDS or all(key in made for key in keys):
                answer = ANSWER_PROMPT.format(results="\n".join(results))
                messages = [*self.request.messages, {"role": "user", "content": answer}]
                choice = "none"
                continue
            made.update(keys)
            rounds += 1
            choice = "auto"
            messages.append({"role": "assistant", "content": turn.content or None,
                             "tool_calls": [{"id": c["id"], "type": "function", "function": {
                                 "name": c["name"], "arguments": c["arguments"]}}
                                 for c in builtin]})
            for call in builtin:
                tool = self.builtin[call["name"]]
                ended = None
                async for event in self._call(tool, call):
                    yield "tool_status", event
                    ended = event
                if ended["status"] == "ERRORED":
                    errors += 1
                    content = json.dumps({"error": ended["error"]}, ensure_ascii=False)
                    if not self.request.resume_generation or errors > MAX_ERRORS:
                        out.failed_tool = ended
                        out.finish_reason = "stop"
                        yield "chunk", self.chunk({}, "stop")
                        return
                else:
                    content = ended["result"]
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
                results.append(f"{tool.type} {call['arguments']} -> {content}")

    async def _call(self, tool: BuiltinTool, call: dict) -> AsyncIterator[dict]:
        try:
            arguments = json.loads(call["arguments"] or "{}")
        except json.JSONDecodeError:
            arguments = None
        parameters = parameters_of(arguments) if isinstance(arguments, dict) else \
            [{"name": "arguments", "value": call["arguments"]}]
        yield tool_status(call["id"], tool, "STARTED", parameters)
        try:
            if not isinstance(arguments, dict):
                raise ToolError("invalid_arguments", "the arguments are not a JSON object")
            output: ToolOutput = await asyncio.wait_for(
                asyncio.to_thread(tool.run, arguments, self.request.context), TOOL_WAIT_S)
        except ToolError as error:
            yield tool_status(call["id"], tool, "ERRORED", parameters,
                              error={"type": error.type, "msg": error.msg})
            return
        except TimeoutError:
            yield tool_status(call["id"], tool, "ERRORED", parameters,
                              error={"type": "timeout", "msg": f"no result in {TOOL_WAIT_S:g} s"})
            return
        except Exception as error:  # a tool's bug is that call's failure, not the response's
            yield tool_status(call["id"], tool, "ERRORED", parameters,
                              error={"type": "internal_error", "msg": str(error)})
            return
        files = [{"name": f.name, "url": f.url} for f in output.files] or None
        yield tool_status(call["id"], tool, "ENDED", parameters,
                          result=json.dumps(output.result, ensure_ascii=False), files=files)

    async def _turn(self, messages: list[dict], choice, turn: _Turn) -> AsyncIterator[tuple[str, dict]]:
        body = {**self.request.fields, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}}
        tools = self._tools(choice)
        if tools:
            body |= {"tools": tools, "tool_choice": choice}
        try:
            async with self.http.stream("POST", self.url, json=body) as response:
                if response.status_code >= 400:
                    await response.aread()
                    try:
                        detail = response.json().get("detail", response.text)
                    except ValueError:
                        detail = response.text
                    raise ContainerError(response.status_code, detail)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    for item in self._read(json.loads(payload), turn):
                        yield item
        except httpx.HTTPError as error:
            raise ContainerError(502, f"the model's container failed: {error}") from None

    def _read(self, data: dict, turn: _Turn):
        if "error" in data:
            raise ContainerError(502, data["error"].get("message", str(data["error"])))
        if data.get("usage"):
            for key in self.outcome.usage:
                self.outcome.usage[key] += data["usage"].get(key) or 0
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            for d in delta.get("tool_calls") or []:
                if d["index"] == len(turn.calls):
                    turn.calls.append({"id": d.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                                       "name": d["function"]["name"], "arguments": ""})
                turn.calls[d["index"]]["arguments"] += d["function"].get("arguments") or ""
            if choice.get("finish_reason"):
                turn.finish_reason = choice["finish_reason"]
            answer = {k: v for k, v in delta.items()
                      if k in ("content", "reasoning_content") and v}
            if answer or choice.get("logprobs"):
                turn.content += answer.get("content", "")
                turn.reasoning += answer.get("reasoning_content", "")
                yield "chunk", self.chunk(answer, logprobs=choice.get("logprobs"))
