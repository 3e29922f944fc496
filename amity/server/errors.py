"""The server's error types and the shapes they take on the wire.

Every error a client can cause is a 4xx with a body that says what to change: 422 in
the spec's `HTTPValidationError` shape (`/v1/messages`: `MessagesErrorResponse`), 404
for an unknown `model`, 503 with `Retry-After` while the model loads or when
`ServerConfig.max_queue_len` requests are already in flight (the server then refuses
rather than grows its queue, and memory, without bound). A failure of the server
itself is a 500 (503 when the engine no longer runs), same shapes, and logged; once a
stream has begun, the same failure ends it with an error event (see sse.py).
"""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from amity.server import schemas as s
from amity.server.protocol import InvalidRequest

log = logging.getLogger("amity.server")

MESSAGES_PATH = "/v1/messages"


class ApiError(Exception):
    def __init__(self, status: int, msg: str, loc=("body",), type: str = "invalid_request",
                 headers: dict | None = None):
        super().__init__(msg)
        self.status, self.msg, self.loc, self.type, self.headers = status, msg, list(loc), type, headers


class ClientDisconnected(Exception):
    """The client hung up before its answer was ready."""


class EngineUnavailable(Exception):
    """The engine loop is not running (it failed or is shutting down): a 503."""


def describe(exc: BaseException) -> tuple[int, str, str]:
    """(HTTP status, error type, message) of a failure, for a response or an error event."""
    if isinstance(exc, ApiError):
        return exc.status, exc.type, exc.msg
    if isinstance(exc, InvalidRequest):
        return 422, exc.type, exc.msg
    if isinstance(exc, EngineUnavailable):
        return 503, "engine_unavailable", str(exc)
    return 500, "internal_error", f"internal error: {exc}"


def anthropic_type(status: int) -> str:
    """Anthropic's error `type` for an HTTP status."""
    return {404: "not_found_error", 503: "overloaded_error"}.get(
        status, "api_error" if status >= 500 else "invalid_request_error")


def error_responses(model: type = s.HTTPValidationError) -> dict:
    """The error responses every API operation can give, for the OpenAPI document: its
    clients (and schemathesis) hold the server to exactly these."""
    return {
        400: {"model": model, "description": "The served model does not do this route's task "
                                             "(an image model on a text route, or the reverse)."},
        404: {"model": model, "description": "`model` names a model this server does not serve."},
        422: {"model": model, "description": "The body is not valid JSON, or breaks the schema "
                                             "or a value range; `loc` names the field to change."},
        503: {"model": model, "description": "The model is still loading, or too many requests "
                                             "are in flight (see `Retry-After`)."},
    }


def _error_response(request: Request, status: int, detail: list[dict], headers=None):
    if request.url.path == MESSAGES_PATH:
        first = detail[0]
        where = ".".join(str(p) for p in first["loc"][1:])
        body = s.MessagesErrorResponse(
            error=s.MessagesErrorObject(
                type=anthropic_type(status),
                message=f"{where}: {first['msg']}" if where else first["msg"]),
        )
        return JSONResponse(body.model_dump(), status_code=status, headers=headers)
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _pydantic_detail(exc: RequestValidationError) -> list[dict]:
    out = []
    for e in exc.errors():
        msg = e.get("msg", "invalid value")
        # pydantic's "Value error, ..." prefix says nothing to the client.
        msg = msg.removeprefix("Value error, ")
        if e.get("type") == "json_invalid":
            msg = f"the body is not valid JSON ({e.get('ctx', {}).get('error', msg)}); send a JSON object"
        loc = [p for p in e.get("loc", ()) if not (isinstance(p, str) and "[" in p)]
        out.append({"loc": loc, "msg": msg, "type": e.get("type", "value_error")})
    return out or [{"loc": ["body"], "msg": "invalid request", "type": "value_error"}]


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError):
        detail = _pydantic_detail(exc)
        ctype = request.headers.get("content-type", "")
        if detail[0]["loc"] == ["body"] and "json" not in ctype.lower():
            # FastAPI does not parse a body sent as another type: say what it expects.
            detail = [{"loc": ["body"], "type": "content_type",
                       "msg": f"the body must be JSON sent with `Content-Type: application/json` "
                              f"(got {ctype or 'no content type'!r})"}]
        return _error_response(request, 422, detail)

    @app.exception_handler(InvalidRequest)
    async def on_invalid(request: Request, exc: InvalidRequest):
        return _error_response(request, 422, exc.detail())

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError):
        return _error_response(
            request, exc.status, [{"loc": exc.loc, "msg": exc.msg, "type": exc.type}], exc.headers)

    @app.exception_handler(EngineUnavailable)
    async def on_engine_down(request: Request, exc: EngineUnavailable):
        return _error_response(request, 503, [{"loc": [], "msg": str(exc), "type": "engine_unavailable"}])

    @app.exception_handler(ClientDisconnected)
    async def on_gone(request: Request, exc: ClientDisconnected):
        # Nobody is listening; 499 is nginx's code for it, for the access log.
        return Response(status_code=499)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400:
            # FastAPI's answer to a body it cannot even decode (not UTF-8, say): bad
            # input like malformed JSON, so the same 422.
            return _error_response(request, 422, [{
                "loc": ["body"], "type": "json_invalid",
                "msg": "the body could not be read: send a JSON object encoded as UTF-8"}])
        return _error_response(
            request, exc.status_code, [{"loc": [], "msg": str(exc.detail), "type": "http_error"}])

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, exc: Exception):
        log.exception("unexpected error serving %s", request.url.path)
        status, type, msg = describe(exc)
        return _error_response(request, status, [{"loc": [], "msg": msg, "type": type}])
