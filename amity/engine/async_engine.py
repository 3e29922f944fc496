"""The asyncio face of the engine, for the web server.

`LLMEngine` runs on one background thread that alone touches engine state; the
event loop only queues commands (add, abort) to it and receives per-step outputs
through one asyncio queue per request, so a long step never blocks the loop and a
request's consumer sees its outputs in order.

That thread also builds the engine (`from_config`). OpenMP keeps a thread team
per thread that starts parallel work: a model built on one thread and stepped on
another ran about 30% slower here (two teams' workers contending for two cores).
"""

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future

from amity.config import EngineConfig
from amity.engine.llm_engine import LLMEngine
from amity.engine.outputs import RequestOutput
from amity.engine.sampling_params import SamplingParams

logger = logging.getLogger("amity.engine")


class EngineDeadError(RuntimeError):
    """The engine loop raised; requests in flight are ended with this."""


class _EngineThread:
    """One daemon thread that runs what it is given, in order: a daemon, unlike
    ThreadPoolExecutor's workers, so a stuck step can never hold up the exit."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="amity-engine", daemon=True).start()

    def submit(self, fn, *args) -> Future:
        future: Future = Future()
        self._jobs.put((future, fn, args))
        return future

    def _serve(self) -> None:
        while True:
            future, fn, args = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as error:  # handed to whoever waits on the future
                    future.set_exception(error)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, worker: _EngineThread | None = None):
        """`worker`: the thread that built `engine`, which will also step it."""
        self.engine = engine
        self._worker = worker or _EngineThread()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, asyncio.Queue] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: Future | None = None
        self._stopping = False
        self._ids = itertools.count()

    @classmethod
    def from_config(cls, config: EngineConfig) -> "AsyncEngine":
        worker = _EngineThread()
        return cls(worker.submit(LLMEngine, config).result(), worker)

    # What the server reads of the model.
    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def model_name(self) -> str:
        return self.engine.model_path.name.removesuffix(".gguf")

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    @property
    def is_encoder_decoder(self) -> bool:
        return self.engine.is_encoder_decoder

    def stats(self) -> dict:
        return {**self.engine.stats(), "num_in_flight": len(self._streams)}

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._running = self._worker.submit(self._run)

    async def shutdown(self) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._running is not None:
            await asyncio.wrap_future(self._running)

    def new_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, *,
                       embedding_to_replace: list[float] | None = None,
                       token_index_to_replace: list[int] | None = None) -> AsyncIterator[RequestOutput]:
        """Per-step outputs of one request. Raises RequestError before anything is
        queued if the engine cannot serve it; leaving the loop early aborts it."""
        self.engine.validate(prompt_token_ids, params, embedding_to_replace, token_index_to_replace)
        if self._running is None or self._running.done():
            raise EngineDeadError("the engine is not running")
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = stream
        self._send(("add", request_id, prompt_token_ids, params, embedding_to_replace,
                    token_index_to_replace))
        finished = False
        try:
            while not finished:
                item = await stream.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._send(("abort", request_id))

    async def abort(self, request_id: str) -> None:
        self._send(("abort", request_id))

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wakeup.set()

    def _deliver(self, request_id: str, item) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.put_nowait(item)

    def _publish(self, request_id: str, item) -> None:
        self._loop.call_soon_threadsafe(self._deliver, request_id, item)

    def _deliver_step(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            self._deliver(out.request_id, out)

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, request_id, ids, params, embeds, indices = command
                try:
                    self.engine.add_request(request_id, ids, params, embeds, indices)
                except Exception as error:  # a validation the caller could not foresee
                    self._publish(request_id, error)
            else:
                self.engine.abort_request(command[1])

    def _run(self) -> None:
        while not self._stopping:
            self._apply_commands()
            if not self.engine.has_unfinished_requests():
                self._wakeup.wait()
                self._wakeup.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as error:
                logger.exception("engine step failed; ending the requests in flight")
                for request_id in list(self.engine.groups):
                    self.engine.abort_request(request_id)
                    self._publish(request_id, EngineDeadError(f"engine step failed: {error}"))
                continue
            # One wake-up of the event loop per step, not one per request.
            if outputs:
                self._loop.call_soon_threadsafe(self._deliver_step, outputs)
