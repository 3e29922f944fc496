"""The FastAPI application: shared state, error shapes, and the non-generation routes.

Every error a client can cause is a 4xx with a body that says what to change: 422 in
the spec's `HTTPValidationError` shape (`/v1/messages`: `MessagesErrorResponse`), 404
for an unknown `model`, 503 with `Retry-After` when more than
`ServerConfig.max_queue_len` requests already wait for the engine (the server then
refuses rather than grows its queue, and memory, without bound). An unexpected
exception is still answered (500, same shape) and logged, never left hanging.
"""

import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from amity.config import ServerConfig
from amity.server import schemas as s
from amity.server.generation import ClientDisconnected, EngineUnavailable
from amity.server.metrics import ServerMetrics
from amity.server.protocol import InvalidRequest, ModelInfo, TokenPieces

log = logging.getLogger("amity.server")

MESSAGES_PATH = "/v1/messages"


class ApiError(Exception):
    def __init__(self, status: int, msg: str, loc=("body",), type: str = "invalid_request",
                 headers: dict | None = None):
        super().__init__(msg)
        self.status, self.msg, self.loc, self.type, self.headers = status, msg, list(loc), type, headers


@dataclass
class ServerState:
    config: ServerConfig
    engine: object | None = None
    model_name: str = ""
    info: ModelInfo | None = None
    pieces: TokenPieces | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    metrics: ServerMetrics | None = None
    load_error: str | None = None

    def attach(self, engine) -> None:
        """Make a loaded engine servable (it may arrive after the server is up)."""
        self.model_name = self.config.served_model_name or engine.model_name
        self.info = ModelInfo(engine.tokenizer, engine.vocab_size, engine.max_model_len)
        self.pieces = TokenPieces(engine.tokenizer)
        self.engine = engine

    def ready_engine(self):
        if self.engine is None:
            raise ApiError(503, "the model is still loading; retry shortly", type="not_ready",
                           headers={"Retry-After": "5"})
        return self.engine

    def resolve_model(self, name: str | None) -> None:
        """The one place the `model` field is interpreted (LoRA adapters will route here)."""
        self.ready_engine()
        if name is not None and name != self.model_name:
            raise ApiError(
                404,
                f"model {name!r} is not served here; use {self.model_name!r} or leave `model` out",
                loc=("body", "model"), type="model_not_found",
            )

    def admit(self) -> None:
        """Refuse new work once the engine's queue is full."""
        waiting = self.engine.stats().get("num_waiting", 0)
        if waiting >= self.config.max_queue_len:
            self.metrics.reject()
            raise ApiError(
                503,
                f"the server is saturated: {waiting} requests are waiting "
                f"(limit {self.config.max_queue_len}); retry later",
                loc=(), type="overloaded", headers={"Retry-After": "1"},
            )


def error_responses(model: type = s.HTTPValidationError) -> dict:
    """The error responses every API operation can give, for the OpenAPI document: its
    clients (and schemathesis) hold the server to exactly these."""
    return {
        404: {"model": model, "description": "`model` names a model this server does not serve."},
        422: {"model": model, "description": "The body is not valid JSON, or breaks the schema "
                                             "or a value range; `loc` names the field to change."},
        503: {"model": model, "description": "The model is still loading, or too many requests "
                                             "are waiting (see `Retry-After`)."},
    }


def state_of(request: Request) -> ServerState:
    return request.app.state.amity


def _error_response(request: Request, status: int, detail: list[dict], headers=None):
    if request.url.path == MESSAGES_PATH:
        first = detail[0]
        where = ".".join(str(p) for p in first["loc"][1:])
        kind = {404: "not_found_error", 503: "overloaded_error"}.get(
            status, "api_error" if status >= 500 else "invalid_request_error")
        body = s.MessagesErrorResponse(
            error=s.MessagesErrorObject(
                type=kind, message=f"{where}: {first['msg']}" if where else first["msg"]),
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
        return _error_response(
            request, 500, [{"loc": [], "msg": f"internal error: {exc}", "type": "internal_error"}])


def build_app(engine, server_config: ServerConfig, *, owns_engine: bool = True) -> FastAPI:
    """`engine` may be None and attached later (`app.state.amity.attach`), so the server
    can answer /health with 503 while the model loads. With `owns_engine`, the app
    starts the engine loop on start-up and shuts it down after the last request drains."""
    from amity.server.routes import chat, completions, messages, tokens

    state = ServerState(server_config)
    state.metrics = ServerMetrics(lambda: state.engine.stats() if state.engine else None)
    if engine is not None:
        state.attach(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # An engine attached later (serve() loading in the background) is its loader's
        # to start and stop.
        started = owns_engine and state.engine is not None
        if started:
            await state.engine.start()
        yield
        if started:
            await state.engine.shutdown()

    app = FastAPI(title="amity: Friendli Container API", version="0.1.0", lifespan=lifespan)
    app.state.amity = state
    install_error_handlers(app)
    for module in (completions, chat, messages, tokens):
        app.include_router(module.router)

    @app.get("/health")
    async def health():
        if state.engine is None:
            msg = state.load_error or "loading"
            return JSONResponse({"status": msg}, status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models", response_model=s.ModelList)
    async def models():
        state.ready_engine()
        card = s.ModelCard(id=state.model_name, created=state.created,
                           max_model_len=state.info.max_model_len)
        return s.ModelList(data=[card])

    @app.get("/metrics")
    async def metrics():
        body = state.metrics.render()
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
