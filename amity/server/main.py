"""`amity serve`: the engine behind uvicorn.

The socket opens before the model loads, so `/health` answers 503 ("loading") until the
engine is ready and 200 after. SIGTERM (or Ctrl-C) stops accepting connections, lets
every in-flight request (streams included) finish, then shuts the engine down.
"""

import asyncio
import contextlib
import logging
import signal
import threading

import uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from amity.config import EngineConfig, ServerConfig
from amity.server.app import build_app

log = logging.getLogger("amity.server")


class _QuietServer(uvicorn.Server):
    """A second server in the same loop (the metrics port) must leave the signal
    handlers to the main one; it stops when the main one does."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class _MainServer(uvicorn.Server):
    """SIGTERM/SIGINT drain and stop the server, as uvicorn does, but are not re-raised
    afterwards: uvicorn's own `capture_signals` re-raises the signal once drained, which
    kills the process (exit code -15) before the engine shuts down. Stopping on a
    signal is the normal way to end `amity serve`, so it exits with 0. A second Ctrl-C
    still forces the exit (uvicorn's `handle_exit`)."""

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def _bound_url(server: uvicorn.Server, host: str) -> str:
    for s in server.servers:
        for sock in s.sockets:
            return f"http://{host}:{sock.getsockname()[1]}"
    return f"http://{host}"


async def serve_async(engine_config: EngineConfig, server_config: ServerConfig) -> int:
    from amity.engine.async_engine import AsyncEngine

    app = build_app(None, server_config)
    state = app.state.amity
    server = _MainServer(uvicorn.Config(
        app, host=server_config.host, port=server_config.port, log_level="info",
        timeout_graceful_shutdown=None,  # drain: wait for every in-flight request
    ))
    servers = [server.serve()]
    metrics_server = None
    if server_config.metrics_port:
        metrics_app = Starlette(routes=[Route("/metrics", lambda request: Response(
            state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"))])
        metrics_server = _QuietServer(uvicorn.Config(
            metrics_app, host=server_config.host, port=server_config.metrics_port,
            log_level="warning"))
        servers.append(metrics_server.serve())
    failed = False

    async def load() -> None:
        nonlocal failed
        try:
            engine = await asyncio.to_thread(AsyncEngine.from_config, engine_config)
            await engine.start()
        except Exception as err:  # noqa: BLE001 - reported, then the server exits
            log.exception("amity: could not load the model")
            state.load_error = f"failed to load the model: {err}"
            failed = True
            server.should_exit = True
            return
        state.attach(engine)
        while not server.started and not server.should_exit:
            await asyncio.sleep(0.05)
        print(f"amity: serving {state.model_name} on {_bound_url(server, server_config.host)}",
              flush=True)

    async def stop_metrics_with_main() -> None:
        await servers_done.wait()
        if metrics_server is not None:
            metrics_server.should_exit = True

    servers_done = asyncio.Event()

    async def main_server() -> None:
        try:
            await servers[0]
        finally:
            servers_done.set()

    loader = asyncio.create_task(load())
    await asyncio.gather(main_server(), stop_metrics_with_main(), *servers[1:])
    loader.cancel()
    await asyncio.gather(loader, return_exceptions=True)
    # The app's lifespan shuts the engine down only if it was attached before start-up.
    if state.engine is not None:
        await state.engine.shutdown()
    return 1 if failed else 0


def serve(engine_config: EngineConfig, server_config: ServerConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return asyncio.run(serve_async(engine_config, server_config))
