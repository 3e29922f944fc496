"""POST /v1/chat/completions and POST /v1/chat/render."""

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import APIRouter, Request

from amity.engine.outputs import TokenLogprob
from amity.server import chat_prompt, protocol
from amity.server import schemas as s
from amity.server.chat_output import ChoiceParser
from amity.server.choice_events import choice_events
from amity.server.errors import error_responses
from amity.server.generation import Generation, start_generation
from amity.server.tool_calls import ToolCall, fold_tool_calls
from amity.server.sse import DONE, SSEResponse, data_frame
from amity.server.state import ServerState, state_of

router = APIRouter()

STREAM_DOC = {
    "content": {"text/event-stream": {"schema": s.StreamedChatData.model_json_schema()}},
    "description": "With `stream: true`: `chat.completion.chunk`s, then `data: [DONE]`.",
}


@dataclass
class ChatRequest:
    """A chat body, translated."""

    prompt: chat_prompt.RenderedPrompt
    params: object
    make_parser: Callable[[], ChoiceParser]
    parse_reasoning: bool = False


def translate(body: s.ChatCompletionBody, state: ServerState) -> ChatRequest:
    tool_choice = body.tool_choice or "auto"
    tools = chat_prompt.tool_dicts(body.tools) if tool_choice != "none" else None
    kwargs = chat_prompt.template_kwargs(body.chat_template_kwargs,
                                         reasoning_effort=body.reasoning_effort,
                                         reasoning_budget=body.reasoning_budget)
    prompt = chat_prompt.render(state.info, chat_prompt.message_dicts(body.messages), tools, kwargs)
    params = protocol.chat_sampling_params(body, state.info)
    if not isinstance(tool_choice, str) or tool_choice == "required":
        # Issue 5: a forced call is a grammar over the calls of the allowed tool(s).
        forced = None if isinstance(tool_choice, str) else tool_choice.function.name
        spec = protocol.tool_call_spec(tools, forced, body.parallel_tool_calls is not False)
        params = protocol.with_structured_output(params, spec)
    parse_reasoning = bool(body.parse_reasoning)
    names = {t["function"]["name"] for t in tools} if tools else None

    def make_parser() -> ChoiceParser:
        return ChoiceParser(
            parse_reasoning=parse_reasoning, starts_in_reasoning=prompt.starts_in_reasoning,
            include_reasoning=body.include_reasoning is not False, tool_names=names,
            parallel_tool_calls=body.parallel_tool_calls is not False)

    return ChatRequest(prompt, params, make_parser, parse_reasoning)


@router.post(
    "/v1/chat/completions",
    response_model=s.ChatCompleteSuccess,
    responses={200: STREAM_DOC, **error_responses()},
)
async def chat_completions(body: s.ChatCompletionBody, request: Request):
    state = state_of(request)
    engine = state.resolve_model(body.model)
    chat = await state.off_loop(translate, body, state)
    gen = await start_generation(request, state, engine, "chatcmpl", [chat.prompt.token_ids],
                                 chat.params)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return SSEResponse(_stream(gen, chat, state, include_usage), gen.aclose)
    return await gen.respond(request, _collect(gen, chat, state))


@dataclass
class _Choice:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    cut_tool_calls: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None

    def tool_results(self) -> list[s.ToolCallResult]:
        """The calls that finished: one that max_tokens cut is left out."""
        return [s.ToolCallResult(id=c.id, function=s.FunctionResult(name=c.name, arguments=c.arguments))
                for k, c in enumerate(self.tool_calls) if k not in self.cut_tool_calls]


async def _collect(gen: Generation, chat: ChatRequest, state: ServerState) -> s.ChatCompleteSuccess:
    choices: dict[int, _Choice] = {}
    async for ev in choice_events(gen, chat.make_parser):
        c = choices.setdefault(ev.index, _Choice())
        c.reasoning += ev.pieces.reasoning
        c.content += ev.pieces.content
        fold_tool_calls(c.tool_calls, ev.pieces.tool_calls)
        c.cut_tool_calls += ev.pieces.cut_tool_calls or []
        if ev.logprobs is not None:
            c.logprobs = (c.logprobs or []) + ev.logprobs
        c.finish_reason = ev.finish_reason or c.finish_reason
    out = []
    for index in sorted(choices):
        c = choices[index]
        extra = {"reasoning_content": c.reasoning} if chat.parse_reasoning else {}
        calls = c.tool_results()
        message = s.ChatChoiceMessage(content=c.content if c.content or not calls else None,
                                      tool_calls=calls or None, **extra)
        logprobs = protocol.chat_logprobs(c.logprobs, state.pieces) if c.logprobs is not None else None
        out.append(s.ChatChoice(index=index, message=message, finish_reason=c.finish_reason,
                                logprobs=logprobs))
    n = gen.counts
    return s.ChatCompleteSuccess(
        id=gen.request_id, model=state.model_name, created=int(time.time()), choices=out,
        usage=protocol.usage(n.prompt_tokens, n.completion_tokens, n.cached_tokens))


async def _stream(gen: Generation, chat: ChatRequest, state: ServerState, include_usage: bool):
    """The role rides on each choice's first delta (as in the spec's example); the
    finishing chunk has an empty `delta`, which the friendli SDK requires."""
    created = int(time.time())
    started: set[int] = set()

    def chunk(index: int, delta: s.StreamedChatChoiceDelta, finish=None, logprobs=None) -> bytes:
        if index not in started:
            started.add(index)
            delta.role = "assistant"
        choice = s.StreamedChatChoice(index=index, delta=delta, finish_reason=finish, logprobs=logprobs)
        return data_frame(s.StreamedChatData(
            id=gen.request_id, model=state.model_name, created=created, choices=[choice]))

    async for ev in choice_events(gen, chat.make_parser):
        p = ev.pieces
        logprobs = protocol.chat_logprobs(ev.logprobs, state.pieces) if ev.logprobs else None
        if p or logprobs:
            extra = {"reasoning_content": p.reasoning} if p.reasoning else {}
            # A call's id and name first, then its arguments fragment by fragment.
            calls = [
                s.StreamedToolCallResult(index=d.index, id=d.id, function=s.StreamedFunctionResult(
                    name=d.name, arguments=d.arguments))
                for d in p.tool_calls or []
            ] or None
            delta = s.StreamedChatChoiceDelta(content=p.content or None, tool_calls=calls, **extra)
            yield chunk(ev.index, delta, logprobs=logprobs)
        if ev.finish_reason is not None:
            yield chunk(ev.index, s.StreamedChatChoiceDelta(), finish=ev.finish_reason)
    if include_usage:
        n = gen.counts
        yield data_frame(s.StreamedChatData(
            id=gen.request_id, model=state.model_name, created=created, choices=[],
            usage=protocol.usage(n.prompt_tokens, n.completion_tokens, n.cached_tokens)))
    yield DONE


@router.post("/v1/chat/render", response_model=s.ChatRenderSuccess,
             responses=error_responses())
async def chat_render(body: s.ChatRenderBody, request: Request):
    state = state_of(request)
    state.resolve_model(body.model)
    prompt = await state.off_loop(
        chat_prompt.render, state.info, chat_prompt.message_dicts(body.messages),
        chat_prompt.tool_dicts(body.tools), body.chat_template_kwargs)
    return s.ChatRenderSuccess(text=prompt.text)
