"""The asyncio face of the engine, for the web server: `EngineClient` over `LLMEngine`.

`LLMEngine` runs on one background thread that alone touches engine state; the
event loop only queues commands (add, abort) to it and receives per-step outputs
through one asyncio queue per request, so a long step never blocks the loop and a
request's consumer sees its outputs in order. Commands issued in one event-loop turn
travel as one batch, so the prompts of a multi-prompt request enter the same step.

That thread also builds the engine (`load`). OpenMP keeps a thread team per thread
that starts parallel work: a model built on one thread and stepped on another ran
about 30% slower here (two teams' workers contending for two cores).

Failures: a step that raises fails the requests in flight (`EngineError`) and the
loop goes on; a loop that dies, or a shutdown, ends every open stream with
`EngineDeadError` and turns `is_healthy()` false. No stream is left waiting.
"""

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future

from amity.config import EngineConfig
from amity.engine.client import EngineDeadError, EngineError
from amity.engine.llm_engine import LLMEngine
from amity.engine.outputs import PoolingOutput, RequestOutput
from amity.engine.pooling_params import PoolingParams, ValidatedPooling
from amity.engine.request import ValidatedRequest
from amity.engine.sampling_params import SamplingParams

logger = logging.getLogger("amity.engine")


class _EngineThread:
    """One daemon thread that runs what it is given, in order: a daemon, unlike
    ThreadPoolExecutor's workers, so neither a stuck step nor a model still loading
    (SIGTERM during `--compile`) can hold up the exit."""

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


class _Stream:
    """One request's outputs. A class, not an async generator: the request is queued
    when it is made, and `aclose()` aborts it even if it was never iterated."""

    def __init__(self, owner: "AsyncEngine", request_id: str):
        self._owner, self.request_id = owner, request_id
        self._items: asyncio.Queue = asyncio.Queue()
        self._done = False

    def __aiter__(self) -> "_Stream":
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        item = await self._items.get()
        if isinstance(item, BaseException):
            self._close(abort=False)
            raise item
        if item.finished:
            self._close(abort=False)
        return item

    def put(self, item) -> None:
        self._items.put_nowait(item)

    def _close(self, abort: bool) -> None:
        if not self._done:
            self._done = True
            self._owner._streams.pop(self.request_id, None)
            if abort:
                self._owner._send(("abort", self.request_id))

    async def aclose(self) -> None:
        self._close(abort=True)


class AsyncEngine:
    def __init__(self, engine: LLMEngine, worker: _EngineThread | None = None):
        """`worker`: the thread that built `engine`, which will also step it."""
        self._core = engine
        self._worker = worker or _EngineThread()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()  # batches of commands
        self._outbox: list[tuple] = []  # this event-loop turn's commands
        self._wakeup = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._live: set[str] = set()  # the engine thread's own view of what it holds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: Future | None = None
        self._stopping = False
        self._dead: str | None = None  # why the engine no longer serves
        self._ids = itertools.count()

    @classmethod
    def from_config(cls, config: EngineConfig) -> "AsyncEngine":
        worker = _EngineThread()
        return cls(worker.submit(LLMEngine, config).result(), worker)

    @classmethod
    async def load(cls, config: EngineConfig) -> "AsyncEngine":
        """`from_config` without blocking the event loop or, if cancelled (SIGTERM while
        the model loads or compiles), the exit: the daemon thread is left to die."""
        worker = _EngineThread()
        return cls(await asyncio.wrap_future(worker.submit(LLMEngine, config)), worker)

    # What the server reads of the model.
    @property
    def tokenizer(self):
        return self._core.tokenizer

    @property
    def model_name(self) -> str:
        return self._core.model_path.name.removesuffix(".gguf")

    @property
    def max_model_len(self) -> int:
        return self._core.max_model_len

    @property
    def vocab_size(self) -> int:
        return self._core.vocab_size

    @property
    def is_encoder_decoder(self) -> bool:
        return self._core.is_encoder_decoder

    @property
    def task(self) -> str:
        return self._core.task

    @property
    def labels(self) -> list[str] | None:
        return self._core.pooler.labels

    def encode_input(self, text: str) -> list[int]:
        return self._core.served.encode_input(text)

    def stats(self) -> dict:
        return {**self._core.stats(), "num_in_flight": len(self._streams)}

    def is_healthy(self) -> bool:
        return self._dead is None and self._running is not None and not self._running.done()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping, self._dead = False, None
        self._worker.submit(self._core.start_background_compile)  # --compile auto
        self._running = self._worker.submit(self._run)

    async def shutdown(self) -> None:
        self._stopping = True
        self._wakeup.set()
        # First, so open streams end even while a step is stuck and the loop cannot stop.
        self._fail_all("the engine shut down before this request finished")
        if self._running is not None:
            await asyncio.gather(asyncio.wrap_future(self._running), return_exceptions=True)
            # The loop has stopped: the thread is free to release what it still holds.
            await asyncio.gather(asyncio.wrap_future(self._worker.submit(self._abort_live)),
                                 return_exceptions=True)

    def new_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    async def validate(self, prompt_token_ids: list[int], params: SamplingParams, *,
                       embedding_to_replace: list[float] | None = None,
                       token_index_to_replace: list[int] | None = None) -> ValidatedRequest:
        # A worker thread: the checks are cheap, compiling a grammar is not.
        return await asyncio.to_thread(self._core.validate, prompt_token_ids, params,
                                       embedding_to_replace, token_index_to_replace)

    def validate_pooling(self, prompt_token_ids: list[int], params: PoolingParams) -> ValidatedPooling:
        return self._core.validate_pooling(prompt_token_ids, params)  # cheap checks; any thread

    def pool(self, request_id: str, prepared: ValidatedPooling) -> AsyncIterator[PoolingOutput]:
        return self.generate(request_id, prepared)  # the same queue; the engine tells them apart

    def generate(self, request_id: str, prepared: ValidatedRequest | ValidatedPooling
                 ) -> AsyncIterator[RequestOutput]:
        if not self.is_healthy():
            raise EngineDeadError(self._dead or "the engine is not running")
        stream = _Stream(self, request_id)
        self._streams[request_id] = stream
        self._send(("add", request_id, prepared))
        return stream

    async def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            await stream.aclose()

    # LoRA adapters (AdapterClient): files read on a worker thread, slots written
    # by the engine thread between steps.
    def lora_adapters(self) -> dict[str, str]:
        return {route: str(a.path) for route, a in self._core.lora_adapters().items()}

    async def load_lora_adapter(self, route: str, path: str) -> None:
        adapter = await asyncio.to_thread(self._core.read_lora_adapter, path)
        await self._between_steps(self._core.install_lora_adapter, route, adapter)

    async def unload_lora_adapter(self, route: str) -> None:
        await self._between_steps(self._core.unload_lora_adapter, route)

    async def _between_steps(self, fn, *args):
        """`fn(*args)` on the engine thread, between two steps."""
        if not self.is_healthy():
            raise EngineDeadError(self._dead or "the engine is not running")
        future: Future = Future()
        self._send(("call", future, fn, args))
        return await asyncio.wrap_future(future)

    # -- the event loop's side ----------------------------------------------

    def _send(self, command: tuple) -> None:
        if not self._outbox and self._loop is not None:
            self._loop.call_soon(self._flush)
        self._outbox.append(command)

    def _flush(self) -> None:
        batch, self._outbox = self._outbox, []
        self._commands.put(batch)
        self._wakeup.set()

    def _deliver(self, request_id: str, item) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.put(item)

    def _deliver_step(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            self._deliver(out.request_id, out)

    def _fail_all(self, reason: str) -> None:
        """The engine no longer serves: say so, and end every open stream."""
        self._dead = self._dead or reason
        for stream in list(self._streams.values()):
            stream.put(EngineDeadError(self._dead))

    # -- the engine thread's side -----------------------------------------

    def _publish(self, request_id: str, item) -> None:
        self._loop.call_soon_threadsafe(self._deliver, request_id, item)

    def _add(self, request_id: str, prepared: ValidatedRequest | ValidatedPooling) -> None:
        try:
            self._live.add(request_id)
            if isinstance(prepared, ValidatedPooling):
                self._core.add_pooling(request_id, prepared)
            else:
                self._core.add_validated(request_id, prepared)
        except Exception as error:  # a RequestError validation could not foresee, or a bug
            # Roll back whatever the engine kept of it, so nothing orphaned is scheduled.
            self._abort(request_id)
            self._publish(request_id, error)

    def _abort(self, request_id: str) -> None:
        self._live.discard(request_id)
        self._core.abort_request(request_id)

    @staticmethod
    def _call(future: Future, fn, args: tuple) -> None:
        try:
            future.set_result(fn(*args))
        except Exception as error:  # the caller's to report
            future.set_exception(error)

    def _abort_live(self) -> None:
        for request_id in list(self._live):
            self._abort(request_id)

    def _apply_commands(self) -> None:
        while True:
            try:
                batch = self._commands.get_nowait()
            except queue.Empty:
                return
            for command in batch:
                if command[0] == "add":
                    self._add(command[1], command[2])
                elif command[0] == "call":
                    self._call(*command[1:])
                else:
                    self._abort(command[1])

    def _step(self) -> None:
        try:
            outputs = self._core.step()
        except Exception as error:
            logger.exception("engine step failed; ending the requests in flight")
            for request_id in list(self._live):
                self._abort(request_id)
                self._publish(request_id, EngineError(f"the engine failed this request: {error}"))
            return
        for out in outputs:
            if out.finished:
                self._live.discard(out.request_id)
        # One wake-up of the event loop per step, not one per request.
        if outputs:
            self._loop.call_soon_threadsafe(self._deliver_step, outputs)
        if not self._core.last_step_scheduled:
            # Requests remain but none can be scheduled: only a command (a new request,
            # an abort freeing blocks) can change that, so wait for one, not spin.
            self._wakeup.wait()

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._wakeup.clear()  # before draining: a command sent after it sets it again
                self._apply_commands()
                if self._core.has_unfinished_requests():
                    self._step()
                else:
                    self._wakeup.wait()
        except BaseException as error:
            logger.exception("the engine loop died")
            self._loop.call_soon_threadsafe(self._fail_all, f"the engine loop died: {error!r}")
            raise
