"""`amity serve`: the engine behind uvicorn.

The socket opens before the model loads, so `/health` answers 503 ("loading") until the
engine is ready and 200 after. SIGTERM (or Ctrl-C) stops accepting connections and lets
the in-flight requests (streams included) finish for up to `--shutdown-timeout`
seconds; then the engine shuts down, the requests still running end with an error
(a stream: an error event), and the process exits. SIGTERM while the model still
loads (or compiles, in the foreground or the background) exits at once: the thread doing
it is a daemon, left behind, and the process ends without the interpreter's teardown
(`_exit_without_teardown`).
"""

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import stat
import sys
import threading
from typing import NoReturn

import torch
import uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from amity.config import EngineConfig, ServerConfig
from amity.images.pipelines import is_diffusers_dir
from amity.server.app import build_app
from amity.server.state import ServerState

log = logging.getLogger("amity.server")


class _QuietServer(uvicorn.Server):
    """A second server in the same loop (the metrics port) must leave the signal
    handlers to the main one; it stops when the main one does."""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


class ApiServer(uvicorn.Server):
    """The API's server. SIGTERM/SIGINT drain and stop it, as uvicorn does, but are not
    re-raised afterwards: uvicorn's own `capture_signals` re-raises the signal once
    drained, which kills the process (exit code -15) before the engine shuts down.
    Stopping on a signal is the normal way to end `amity serve`, so it exits with 0. A
    second Ctrl-C still forces the exit (uvicorn's `handle_exit`).

    The drain lasts at most `shutdown_timeout_s`: then the engine shuts down, which
    ends every open stream with an error event, and the connections close. uvicorn's
    own timeout, a little later, is the backstop (it cancels what is left, silently)."""

    def __init__(self, app, state: ServerState, host: str, port: int, shutdown_timeout_s: float,
                 log_level: str = "info"):
        # h11 named: uvicorn would take httptools (installed for the Suite) otherwise.
        super().__init__(uvicorn.Config(app, host=host, port=port, log_level=log_level, http="h11",
                                        timeout_graceful_shutdown=shutdown_timeout_s + 10))
        self.state = state
        self.shutdown_timeout_s = shutdown_timeout_s

    async def shutdown(self, sockets=None) -> None:
        cutoff = asyncio.get_running_loop().call_later(
            self.shutdown_timeout_s, lambda: asyncio.ensure_future(self._cut_off()))
        try:
            await super().shutdown(sockets)
        finally:
            cutoff.cancel()

    async def _cut_off(self) -> None:
        if self.state.engine is not None:
            log.warning("requests still in flight %.0f s after the shutdown began "
                        "(--shutdown-timeout): ending them", self.shutdown_timeout_s)
            await self.state.engine.shutdown()

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


def load_image_service(engine_config: EngineConfig, server_config: ServerConfig):
    """A diffusers directory's pipelines behind a started image service."""
    from amity.images.pipelines import load_pipelines
    from amity.images.service import ImageService

    if engine_config.num_threads:
        torch.set_num_threads(engine_config.num_threads)
    service = ImageService(load_pipelines(engine_config.model, engine_config.device,
                                          engine_config.dtype),
                           max_batch_size=engine_config.max_num_seqs,
                           batch_wait_s=server_config.image_batch_wait_ms / 1000)
    service.start()
    return service


def _bind_unix_socket(path: str) -> socket.socket:
    """A listening socket at `path`, readable and writable by this user only (the API
    has no authentication of its own). A socket file already there is a killed
    server's, and is replaced; any other file there is an error."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.stat(path).st_mode):
            os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o600)
    except OSError:
        sock.close()
        raise
    return sock


def _remove_unix_socket(path: str, sock: socket.socket) -> None:
    sock.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _bound_url(server: uvicorn.Server, host: str) -> str:
    for s in server.servers:
        for sock in s.sockets:
            return f"http://{host}:{sock.getsockname()[1]}"
    return f"http://{host}"


async def serve_async(engine_config: EngineConfig, server_config: ServerConfig) -> tuple[int, bool]:
    """The exit code, and whether a thread was left running torch code (a load or a
    compile that SIGTERM cut short)."""
    from amity.engine.async_engine import AsyncEngine
    from amity.engine.async_transcription import AsyncTranscriptionEngine
    from amity.engine.background_compile import CompileState
    from amity.models.packaged_whisper import whisper_model_dir

    app = build_app(None, server_config)
    state = app.state.amity
    server = ApiServer(app, state, server_config.host, server_config.port,
                       server_config.shutdown_timeout)
    unix_socket = _bind_unix_socket(server_config.uds) if server_config.uds else None
    inherited = socket.socket(fileno=server_config.fd) if server_config.fd is not None else None
    # Given sockets, uvicorn serves those instead of binding its own: the TCP port (the
    # inherited socket, or bound as uvicorn would bind it) and the Unix socket.
    if inherited is None and unix_socket is None:
        servers = [server.serve()]
    else:
        tcp_socket = inherited if inherited is not None else server.config.bind_socket()
        servers = [server.serve([s for s in (tcp_socket, unix_socket) if s is not None])]
    metrics_server = None
    if server_config.metrics_port:
        metrics_app = Starlette(routes=[Route("/metrics", lambda request: Response(
            state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8"))])
        metrics_server = _QuietServer(uvicorn.Config(
            metrics_app, host=server_config.host, port=server_config.metrics_port,
            log_level="warning", http="h11"))
        servers.append(metrics_server.serve())
    failed = False

    async def load() -> None:
        nonlocal failed
        try:
            whisper_dir = whisper_model_dir(engine_config.model)
            if is_diffusers_dir(engine_config.model):
                state.attach_images(await asyncio.to_thread(
                    load_image_service, engine_config, server_config))
            else:
                if whisper_dir is not None:  # speech to text: /v1/audio/transcriptions
                    engine = await AsyncTranscriptionEngine.load(
                        dataclasses.replace(engine_config, model=str(whisper_dir)))
                else:
                    engine = await AsyncEngine.load(engine_config)
                await engine.start()
                state.attach(engine)
        except Exception as err:  # noqa: BLE001 - reported, then the server exits
            log.exception("amity: could not load the model")
            state.load_error = f"failed to load the model: {err}"
            failed = True
            server.should_exit = True
            return
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

    # uvicorn imports its protocol modules as it loads its config: done here, before the
    # loading thread starts importing torch and transformers, because that import, made
    # while the thread's were under way, failed once on a fresh machine ("No module named
    # 'uvicorn.protocols.http.h11_impl'", and no server); why is not known.
    for pending in (server, metrics_server):
        if pending is not None:
            pending.config.load()
    loader = asyncio.create_task(load())
    try:
        await asyncio.gather(main_server(), stop_metrics_with_main(), *servers[1:])
    finally:
        if unix_socket is not None:
            _remove_unix_socket(server_config.uds, unix_socket)
    loader.cancel()
    await asyncio.gather(loader, return_exceptions=True)
    load_abandoned = state.engine is None and state.images is None and not failed
    compiling = False
    # The app's lifespan shuts the engine down only if it was attached before start-up.
    if state.engine is not None:
        await state.engine.shutdown()
        compiling = state.engine.stats().get("compile_state") == CompileState.COMPILING
    if state.images is not None:
        await asyncio.to_thread(state.images.shutdown)
    return (1 if failed else 0), load_abandoned or compiling


def _exit_without_teardown(code: int) -> NoReturn:
    """End the process now. The interpreter's teardown would stop a daemon thread
    still inside torch when it next takes the GIL, by unwinding C++ frames that must
    not unwind: std::terminate, SIGABRT ("terminate called without an active
    exception", exit code -6), seen under load with a background compile under way.
    The server itself has shut down in order by then; only the logs need flushing."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve(engine_config: EngineConfig, server_config: ServerConfig) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    code, torch_work_left = asyncio.run(serve_async(engine_config, server_config))
    if torch_work_left:
        _exit_without_teardown(code)
    return code
