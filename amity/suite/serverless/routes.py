"""Serverless routes: the model catalog and tool-assisted chat.

`GET /serverless/v1/models` needs no token (the spec declares no security) and
ignores one that is sent. `POST /serverless/tools/v1/chat/completions` resolves
`model` in the catalog (unknown: 404; a model without `builtin_tool`: 422), leases a
slot on one of its shared replicas (ServerlessReplicas; held until the loop ends) and
runs the tool loop: a stream of `tool_status` events and answer chunks, or one chat
result.
"""

import json
from collections.abc import Awaitable, Callable

import anyio
import httpx
from fastapi import APIRouter, Depends, Header, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from amity.suite.auth import Caller, caller
from amity.suite.errors import ApiError
from amity.suite.serverless.inference import catalog_model, lease
from amity.suite.serverless.schemas import (FileBuiltInTool, FunctionTool,
                                            ServerlessModelListSuccess, ToolAssistedChatBody)
from amity.suite.accept import wants_stream
from amity.suite.tools.base import ToolContext
from amity.suite.tools.files import StoreFiles
from amity.suite.tools.loop import ContainerError, LoopRequest, ToolLoop
from amity.suite.tools.registry import BUILTIN_TOOLS

router = APIRouter(tags=["Serverless"])
DONE = b"data: [DONE]\n\n"
CONTAINER_TIMEOUT = httpx.Timeout(connect=10.0, read=600.0, write=60.0, pool=10.0)


@router.get("/serverless/v1/models", response_model=ServerlessModelListSuccess,
            summary="Retrieve serverless models", operation_id="serverlessModelList")
def list_models(request: Request):
    catalog = request.app.state.catalog
    return ServerlessModelListSuccess(data=[e.item() for e in catalog.entries.values()])


def _loop_request(body: ToolAssistedChatBody, context: ToolContext) -> LoopRequest:
    builtin, functions = [], []
    for tool in body.tools or []:
        if isinstance(tool, FunctionTool):
            functions.append(tool.model_dump(exclude_none=True))
            continue
        if any(t.type == tool.type for t in builtin):
            raise ApiError(422, f"the tool {tool.type} is listed twice", loc=("body", "tools"),
                           type="value_error")
        builtin.append(BUILTIN_TOOLS[tool.type])
        if isinstance(tool, FileBuiltInTool):
            context.file_ids = list(tool.files)
    reserved = {t.function_name: t.type for t in BUILTIN_TOOLS.values()}
    for f in functions:
        if f["function"]["name"] in reserved:
            raise ApiError(422, f"the function name {f['function']['name']!r} is taken by the "
                                f"built-in tool {reserved[f['function']['name']]}",
                           loc=("body", "tools"), type="value_error")
    choice = body.tool_choice or "auto"
    if not isinstance(choice, str):
        name = choice.function.name
        offered = {t.type: t.function_name for t in builtin} | {
            t.function_name: t.function_name for t in builtin} | {
            f["function"]["name"]: f["function"]["name"] for f in functions}
        if name not in offered:
            raise ApiError(422, f"`tool_choice` names {name!r}, which is not in `tools`",
                           loc=("body", "tool_choice"), type="value_error")
        choice = {"type": "function", "function": {"name": offered[name]}}
    elif choice == "required" and not (builtin or functions):
        raise ApiError(422, "`tool_choice` is `required` but no `tools` are given",
                       loc=("body", "tool_choice"), type="value_error")
    return LoopRequest(model=body.model, messages=body.messages, builtin=builtin,
                       functions=functions, tool_choice=choice,
                       resume_generation=bool(body.resume_generation),
                       fields=body.passed_through(), context=context)


def _detail(error: ContainerError) -> str:
    detail = error.detail if isinstance(error.detail, str) else json.dumps(error.detail)
    return f"the model's container: {detail}"


def _frame(data: dict, event: str | None = None) -> bytes:
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return (f"event: {event}\n" if event else "").encode() + f"data: {text}\n\n".encode()


async def _frames(loop: ToolLoop, events, first, include_usage: bool):
    try:
        item = first
        while item is not None:
            kind, data = item
            yield _frame(data, "tool_status" if kind == "tool_status" else None)
            item = await anext(events, None)
        if include_usage:
            out = loop.outcome
            yield _frame({"id": out.id, "object": "chat.completion.chunk", "created": out.created,
                          "model": loop.request.model, "choices": [], "usage": out.usage})
        yield DONE
    except ContainerError as error:
        # The status went out with the first byte: the failure is told in the stream,
        # as the container's own streams do.
        yield _frame({"error": {"message": _detail(error), "type": "container_error",
                                "code": error.status}})
        yield DONE


class _LoopStream(StreamingResponse):
    """A tool loop's stream, which closes the loop (its container request, the HTTP
    client, the replica slot) however it ends. Not in the frames' generator: a client
    that left before the first byte makes Starlette cancel the body before it starts,
    and a generator that never started runs no `finally`."""

    def __init__(self, frames, close: Callable[[], Awaitable[None]]):
        super().__init__(frames, media_type="text/event-stream")
        self.close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()
                await self.close()


def _result(loop: ToolLoop) -> dict:
    out = loop.outcome
    if out.failed_tool is not None:
        error = out.failed_tool["error"]
        raise ApiError(422, f"the built-in tool {out.failed_tool['name']} failed "
                            f"({error['type']}): {error['msg']}. With `resume_generation: true` "
                            f"the model is told the error and goes on.",
                       loc=("body", "tools"), type="tool_error")
    message = {"role": "assistant", "content": out.content or (None if out.tool_calls else "")}
    if out.tool_calls:
        message["tool_calls"] = out.tool_calls
    if out.reasoning:
        message["reasoning_content"] = out.reasoning
    return {"id": out.id, "object": "chat.completion", "created": out.created,
            "model": loop.request.model, "usage": out.usage,
            "choices": [{"index": 0, "message": message, "finish_reason": out.finish_reason,
                         "logprobs": None}]}


@router.post("/serverless/tools/v1/chat/completions",
             summary="Tool assisted chat completions",
             operation_id="serverlessToolAssistedChatComplete")
async def tool_assisted_chat(body: ToolAssistedChatBody, request: Request,
                             accept: str | None = Header(None),
                             who: Caller = Depends(caller)):
    state = request.app.state
    entry = catalog_model(request, body.model)
    if not entry.functionality.builtin_tool:
        raise ApiError(422, f"{body.model} cannot be used with tool-assisted chat "
                            f"(its `functionality.builtin_tool` is false)",
                       loc=("body", "model"), type="value_error")
    files = StoreFiles(state.sessions, state.objects, who, state.config.file_ttl_s)
    loop_request = _loop_request(body, ToolContext(state.tool_settings, files))
    slot = await lease(request, entry)
    http = httpx.AsyncClient(timeout=CONTAINER_TIMEOUT, trust_env=False)
    loop = ToolLoop(http, slot.url, loop_request)
    events = loop.run()

    async def close() -> None:
        await events.aclose()  # ends its request to the container
        await http.aclose()
        slot.release()

    handed_over = False  # to a stream, which closes the loop when it ends (_LoopStream)
    try:
        # The first turn's refusal (a bad sampling value, say) is the response's status.
        first = await anext(events, None)
        if wants_stream(body.stream, accept):
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            response = _LoopStream(_frames(loop, events, first, include_usage), close)
            handed_over = True
            return response
        async for _ in events:
            pass
    except ContainerError as error:
        raise ApiError(error.status, _detail(error), loc=("body",), type="container_error") from None
    finally:
        if not handed_over:
            await close()
    return _result(loop)
