"""The FastAPI application: the routes, the error handlers, and the non-generation
endpoints (`/health`, `/v1/models`, `/metrics`).

`/health` is 200 only while the engine serves: 503 while the model loads, when it
failed to load, and once the engine loop has died or shut down.
"""

from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse, Response

from amity.config import ServerConfig
from amity.engine.client import EngineClient
from amity.server import schemas as s
from amity.server.errors import install_error_handlers
from amity.server.routes import chat, completions, images, lora, messages, pooling, tokens, transcriptions
from amity.server.state import ServerState
from amity.server.tasks import require_task


def build_app(engine: EngineClient | None, server_config: ServerConfig, *,
              owns_engine: bool = True) -> FastAPI:
    """`engine` may be None and attached later (`app.state.amity.attach`), so the server
    can answer /health with 503 while the model loads. With `owns_engine`, the app
    starts the engine loop on start-up and shuts it down after the last request drains."""
    state = ServerState(server_config)
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

    # require_task: each route answers only for a model of its task (tasks.py).
    app = FastAPI(title="amity: Friendli Container API", version="0.1.0", lifespan=lifespan,
                  dependencies=[Depends(require_task)])
    app.state.amity = state
    install_error_handlers(app)
    for module in (completions, chat, messages, tokens, pooling, images, transcriptions, lora):
        app.include_router(module.router)

    @app.get("/health")
    async def health():
        if state.images is not None:
            return ({"status": "ok"} if state.images.is_healthy() else JSONResponse(
                {"status": "the image service is not running; see the server log"}, 503))
        if state.engine is None:
            return JSONResponse({"status": state.load_error or "loading"}, status_code=503)
        if not state.engine.is_healthy():
            return JSONResponse({"status": "the engine is not running; see the server log"},
                                status_code=503)
        return {"status": "ok"}

    @app.get("/v1/models", response_model=s.ModelList)
    async def models():
        if state.images is not None:
            return s.ModelList(data=[s.ModelCard(id=state.model_name, created=state.created)])
        state.ready_engine()
        card = s.ModelCard(id=state.model_name, created=state.created,
                           max_model_len=state.info.max_model_len)
        # LoRA adapters as vLLM lists them: `root` their path, `parent` the base.
        adapters = [s.ModelCard(id=route, created=state.created, max_model_len=state.info.max_model_len,
                                root=path, parent=state.model_name)
                    for route, path in state.adapters().items()]
        return s.ModelList(data=[card, *adapters])

    @app.get("/metrics")
    async def metrics():
        body = state.metrics.render()
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
