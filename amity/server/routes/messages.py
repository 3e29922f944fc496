"""POST /v1/messages: the Anthropic Messages format over the same chat machinery.

Anthropic blocks become chat-template messages (tool results become `tool` turns,
`tool_use` blocks become `tool_calls`, `thinking` becomes `reasoning_content`), the
output is split by the same `ChoiceParser` as chat, and its pieces become content
blocks. Errors use `MessagesErrorResponse` (see app.py).
"""

import json

from fastapi import APIRouter, Request

from amity.engine.structured_output import StructuredOutputSpec
from amity.server import chat_prompt, protocol
from amity.server import messages_schemas as m
from amity.server.chat_output import ChoiceParser
from amity.server.choice_events import choice_events
from amity.server.errors import error_responses
from amity.server.generation import Generation, new_id, start_generation
from amity.server.protocol import InvalidRequest
from amity.server.schemas import MessagesErrorResponse
from amity.server.sse import SSEResponse, event_frame, messages_error
from amity.server.state import ServerState, state_of
from amity.server.tool_calls import ToolCall, fold_tool_calls

router = APIRouter()

STREAM_DOC = {
    "content": {"text/event-stream": {}},
    "description": "With `stream: true`: message_start, content_block_start, "
                   "content_block_delta, content_block_stop, message_delta, message_stop.",
}


def _tool_result_text(block: m.ToolResultBlock) -> str:
    if block.content is None or isinstance(block.content, str):
        return block.content or ""
    return "\n".join(b.get("text", "") if b.get("type") == "text" else json.dumps(b)
                     for b in block.content)


def chat_messages(body: m.MessagesBody) -> list[dict]:
    out = []
    if body.system:
        system = body.system if isinstance(body.system, str) else "\n".join(b.text for b in body.system)
        out.append({"role": "system", "content": system})
    for i, msg in enumerate(body.messages):
        if isinstance(msg.content, str):
            out.append({"role": msg.role, "content": msg.content})
            continue
        texts, calls, thinking, results = [], [], [], []
        for j, block in enumerate(msg.content):
            if isinstance(block, m.TextBlock):
                texts.append(block.text)
            elif isinstance(block, m.ImageBlock):
                raise InvalidRequest(
                    "this model reads text only and cannot take an 'image' block; send text",
                    ["messages", i, "content", j, "type"], type="not_supported")
            elif isinstance(block, m.ToolUseBlock):
                calls.append({"id": block.id or new_id("toolu"), "type": "function",
                              "function": {"name": block.name, "arguments": block.input}})
            elif isinstance(block, m.ToolResultBlock):
                results.append({"role": "tool", "tool_call_id": block.tool_use_id,
                                "content": _tool_result_text(block)})
            elif isinstance(block, m.ThinkingBlock):
                thinking.append(block.thinking)
        # Anthropic puts tool results inside the user turn; templates expect `tool` turns
        # right after the assistant's calls, before any new user text.
        out.extend(results)
        if texts or calls or not results:
            d = {"role": msg.role, "content": "\n".join(texts)}
            if calls:
                d["tool_calls"] = calls
            if thinking:
                d["reasoning_content"] = "\n".join(thinking)
            out.append(d)
    return out


# SamplingParams' names for the Messages fields that are called otherwise here.
WIRE_NAMES = {"stop": "stop_sequences"}


def _template_kwargs(body: m.MessagesBody) -> dict:
    """`thinking` as `enable_thinking` (and its budget), `output_config.effort` as
    `reasoning_effort`: `adaptive` leaves the template's default."""
    kind = body.thinking.type if body.thinking else None
    return chat_prompt.template_kwargs(
        None, enable_thinking={"enabled": True, "disabled": False}.get(kind),
        reasoning_budget=body.thinking.budget_tokens if body.thinking else None,
        reasoning_effort=body.output_config.effort if body.output_config else None)


def translate(body: m.MessagesBody, state: ServerState):
    choice = body.tool_choice.type if body.tool_choice else "auto"
    tools = None
    if body.tools and choice != "none":
        tools = [{"type": "function", "function": {
            "name": t.name, "description": t.description or "",
            "parameters": t.input_schema or {"type": "object", "properties": {}}}}
            for t in body.tools]
    prompt = chat_prompt.render(state.info, chat_messages(body), tools, _template_kwargs(body))
    params = protocol.make_sampling_params({
        "max_tokens": body.max_tokens, "temperature": body.temperature, "top_p": body.top_p,
        "top_k": body.top_k, "stop": body.stop_sequences, "seed": body.seed,
    }, WIRE_NAMES)
    thinking = bool(body.thinking and body.thinking.type != "disabled")
    names = {t["function"]["name"] for t in tools} if tools else None
    parallel = not (body.tool_choice and body.tool_choice.disable_parallel_tool_use)
    if choice in ("any", "tool"):
        # Issue 5: a forced call is a grammar over the calls of the allowed tool(s).
        if choice == "tool" and not body.tool_choice.name:
            raise InvalidRequest("`tool_choice` of type 'tool' needs the tool's `name`",
                                 ["tool_choice", "name"])
        spec = protocol.tool_call_spec(tools, body.tool_choice.name if choice == "tool" else None,
                                       parallel)
        params = protocol.with_structured_output(params, spec, WIRE_NAMES)
    fmt = body.output_config.format if body.output_config else None
    if fmt is not None and fmt.type == "json_schema":
        if params.structured_output is not None:
            raise InvalidRequest("`output_config.format` cannot be combined with a forced tool "
                                 "call: the output follows one grammar", ["output_config", "format"])
        if fmt.schema_ is None:
            raise InvalidRequest("a `json_schema` output format needs its `schema`",
                                 ["output_config", "format", "schema"])
        params = protocol.with_structured_output(
            params, StructuredOutputSpec("json_schema", fmt.schema_, field="output_config"),
            WIRE_NAMES)

    def make_parser() -> ChoiceParser:
        return ChoiceParser(parse_reasoning=thinking, starts_in_reasoning=prompt.starts_in_reasoning,
                            tool_names=names, parallel_tool_calls=parallel)

    return prompt, params, make_parser


@router.post(
    "/v1/messages",
    response_model=m.MessagesSuccess,
    responses={200: STREAM_DOC, **error_responses(MessagesErrorResponse)},
)
async def messages(body: m.MessagesBody, request: Request):
    state = state_of(request)
    engine = state.resolve_model(body.model)
    prompt, params, make_parser = await state.off_loop(translate, body, state)
    gen = await start_generation(request, state, engine, "msg", [prompt.token_ids], params)
    if body.stream:
        return SSEResponse(_stream(gen, state, make_parser), gen.aclose, messages_error)
    return await gen.respond(request, _collect(gen, state, make_parser))


def anthropic_stop(finish_reason: str, stop_reason: str | tuple[int, ...] | None
                   ) -> tuple[m.StopReason, str | None]:
    """`stop_reason` and `stop_sequence` from a choice's finish reason and the stop the
    engine matched (`CompletionOutput.stop_reason`: the stop string, or a stop-token
    sequence; None for an EOS or a length limit)."""
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(stop_reason, str):
        return "stop_sequence", stop_reason
    return "end_turn", None


def _tool_input(call: ToolCall) -> dict:
    try:
        value = json.loads(call.arguments)
    except json.JSONDecodeError:
        value = None
    return value if isinstance(value, dict) else {"arguments": call.arguments}


def _usage(gen: Generation, output_tokens: int | None = None) -> m.MessagesUsage:
    """Anthropic's meaning: the prompt is `input_tokens + cache_read_input_tokens`, so
    the tokens read from the prefix cache are not counted in `input_tokens` too."""
    c = gen.counts
    return m.MessagesUsage(
        input_tokens=c.prompt_tokens - c.cached_tokens, cache_read_input_tokens=c.cached_tokens,
        output_tokens=c.completion_tokens if output_tokens is None else output_tokens)


async def _collect(gen, state, make_parser) -> m.MessagesSuccess:
    blocks: list = []

    def append(kind: str, text: str) -> None:
        if not text:
            return
        if blocks and blocks[-1].type == kind:
            last = blocks[-1]
            setattr(last, kind, getattr(last, kind) + text)
        else:
            blocks.append(m.ResponseThinkingBlock(thinking=text) if kind == "thinking"
                          else m.ResponseTextBlock(text=text))

    finish, matched = "stop", None
    calls: list[ToolCall] = []
    cut: list[int] = []
    async for ev in choice_events(gen, make_parser):
        append("thinking", ev.pieces.reasoning)
        append("text", ev.pieces.content)
        known = len(calls)
        fold_tool_calls(calls, ev.pieces.tool_calls)
        blocks += calls[known:]  # in their place among the text; their input is read at the end
        cut += ev.pieces.cut_tool_calls or []
        finish = ev.finish_reason or finish
        matched = ev.stop_reason or matched
    cut_ids = {id(calls[k]) for k in cut}  # the calls max_tokens cut are left out
    content = [m.ResponseToolUseBlock(id=b.id, name=b.name, input=_tool_input(b))
               if isinstance(b, ToolCall) else b for b in blocks if id(b) not in cut_ids]
    reason, sequence = anthropic_stop(finish, matched)
    return m.MessagesSuccess(id=gen.request_id, model=state.model_name, content=content,
                             stop_reason=reason, stop_sequence=sequence, usage=_usage(gen))


async def _stream(gen, state, make_parser):
    """Only the spec's events, each with its `event:` line (no ping, no [DONE])."""
    yield event_frame("message_start", {"type": "message_start", "message": {
        "id": gen.request_id, "type": "message", "role": "assistant", "model": state.model_name,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": _usage(gen, output_tokens=0).model_dump()}})
    index, open_kind = -1, None

    def start(kind: str, block: dict):
        nonlocal index, open_kind
        frames = close()
        index, open_kind = index + 1, kind
        frames.append(event_frame("content_block_start", {
            "type": "content_block_start", "index": index, "content_block": block}))
        return frames

    def close():
        nonlocal open_kind
        if open_kind is None:
            return []
        open_kind = None
        return [event_frame("content_block_stop", {"type": "content_block_stop", "index": index})]

    def delta(payload: dict) -> bytes:
        return event_frame("content_block_delta", {
            "type": "content_block_delta", "index": index, "delta": payload})

    finish, matched = "stop", None
    async for ev in choice_events(gen, make_parser):
        p = ev.pieces
        if p.reasoning:
            if open_kind != "thinking":
                for f in start("thinking", {"type": "thinking", "thinking": ""}):
                    yield f
            yield delta({"type": "thinking_delta", "thinking": p.reasoning})
        if p.content:
            if open_kind != "text":
                for f in start("text", {"type": "text", "text": ""}):
                    yield f
            yield delta({"type": "text_delta", "text": p.content})
        for d in p.tool_calls or []:  # a call's block opens with its name, then its input streams
            if d.id is not None:
                for f in start("tool_use", {"type": "tool_use", "id": d.id, "name": d.name,
                                            "input": {}}):
                    yield f
            if d.arguments:
                yield delta({"type": "input_json_delta", "partial_json": d.arguments})
        finish = ev.finish_reason or finish
        matched = ev.stop_reason or matched
    for f in close():
        yield f
    reason, sequence = anthropic_stop(finish, matched)
    yield event_frame("message_delta", {
        "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
        "usage": {"output_tokens": gen.counts.completion_tokens}})
    yield event_frame("message_stop", {"type": "message_stop"})
