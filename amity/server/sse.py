"""Server-sent events: framing, and the response that carries them.

The OpenAI-style APIs send `data: {json}` frames ending in `data: [DONE]`; the Messages
API sends `event: NAME` + `data: {json}` frames and nothing else (the friendli SDK
rejects events it does not know, such as `ping` or a `[DONE]` line).
"""

import json
from collections.abc import AsyncIterator, Awaitable, Callable

from pydantic import BaseModel
from starlette.responses import StreamingResponse

DONE = b"data: [DONE]\n\n"


def _json(payload: BaseModel | dict) -> str:
    if isinstance(payload, BaseModel):
        return payload.model_dump_json()
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def data_frame(payload: BaseModel | dict) -> bytes:
    return f"data: {_json(payload)}\n\n".encode()


def event_frame(event: str, payload: BaseModel | dict) -> bytes:
    return f"event: {event}\ndata: {_json(payload)}\n\n".encode()


class SSEResponse(StreamingResponse):
    """A token stream whose `on_close` runs however it ends. Starlette cancels the
    response when the client disconnects; that may happen before the body generator
    has even started (so its own `finally` would never run), hence the hook here, after
    Starlette's task group has exited."""

    def __init__(self, frames: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]):
        # Proxies (nginx) must not buffer a token stream.
        super().__init__(frames, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()
