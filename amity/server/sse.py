"""Server-sent events: framing, the response that carries them, and its error event.

The OpenAI-style APIs send `data: {json}` frames ending in `data: [DONE]`; the Messages
API sends `event: NAME` + `data: {json}` frames and nothing else (the friendli SDK
rejects events it does not know, such as `ping` or a `[DONE]` line).

Once the first byte is out the status is sent, so a failure after it (the engine
failed, or stopped, or the server is shutting down) is told in the stream's own
format instead of cutting the connection: `data: {"error": {...}}` then
`data: [DONE]` (what OpenAI's SDK raises as an `APIError`), or Anthropic's
`event: error` with `{"type": "error", "error": {"type", "message"}}`.
"""

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from pydantic import BaseModel
from starlette.responses import StreamingResponse

from amity.server.errors import ClientDisconnected, anthropic_type, describe

log = logging.getLogger("amity.server")

DONE = b"data: [DONE]\n\n"


def _json(payload: BaseModel | dict) -> str:
    if isinstance(payload, BaseModel):
        return payload.model_dump_json()
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def data_frame(payload: BaseModel | dict) -> bytes:
    return f"data: {_json(payload)}\n\n".encode()


def event_frame(event: str, payload: BaseModel | dict) -> bytes:
    return f"event: {event}\ndata: {_json(payload)}\n\n".encode()


def openai_error(status: int, type: str, message: str) -> bytes:
    return data_frame({"error": {"message": message, "type": type, "code": status}}) + DONE


def messages_error(status: int, type: str, message: str) -> bytes:
    return event_frame("error", {"type": "error",
                                 "error": {"type": anthropic_type(status), "message": message}})


class SSEResponse(StreamingResponse):
    """A token stream whose `on_close(error)` runs however it ends (`error` is what
    ended it, None for a finished stream or a hang-up). Starlette cancels the response
    when the client disconnects; that may happen before the body generator has even
    started (so its own `finally` would never run), hence the hook here, after
    Starlette's task group has exited. `error_frame` renders a failure in the stream's
    format: `openai_error` or `messages_error`."""

    def __init__(self, frames: AsyncIterator[bytes],
                 on_close: Callable[[BaseException | None], Awaitable[None]],
                 error_frame: Callable[[int, str, str], bytes] = openai_error):
        # Proxies (nginx) must not buffer a token stream.
        super().__init__(self._guarded(frames), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close
        self._error_frame = error_frame
        self._error: BaseException | None = None

    async def _guarded(self, frames: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        try:
            async for frame in frames:
                yield frame
        except ClientDisconnected:
            return
        except Exception as error:  # noqa: BLE001 - told to the client, in its format
            status, type, message = describe(error)
            if status >= 500 and status != 503:
                log.error("stream failed after it began", exc_info=error)
            self._error = error
            yield self._error_frame(status, type, message)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close(self._error)
