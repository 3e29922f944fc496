"""One wire request's run on the engine, for every API.

A wire request may be several engine requests (a completions `prompt` list: each
prompt is its own engine request with its own `n` choices, indexed as OpenAI does:
prompt i's choice j is choice i * n + j). `Generation` starts them, surfaces their
`RequestError`s before any response byte is sent (so a bad request is a 422, not a
broken stream), merges their deltas into one stream, and aborts whatever is still
running when it is closed: on a finished response, a client hang-up or an error.
"""

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio

from amity.engine.async_engine import EngineDeadError
from amity.engine.errors import RequestError
from amity.engine.outputs import CompletionOutput, RequestOutput
from amity.engine.sampling_params import SamplingParams
from amity.server.protocol import InvalidRequest

log = logging.getLogger("amity.server")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


@dataclass
class Counts:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    # The latest known per engine request, summed across them on read.
    _per_request: dict[int, tuple[int, int]] = field(default_factory=dict)

    def set_prompt(self, i: int, step: RequestOutput) -> None:
        self._per_request[i] = (step.num_prompt_tokens, step.num_cached_tokens)
        self.prompt_tokens = sum(p for p, _ in self._per_request.values())
        self.cached_tokens = sum(c for _, c in self._per_request.values())

    def update(self, i: int, step: RequestOutput) -> None:
        self.set_prompt(i, step)
        self.completion_tokens += sum(len(o.new_token_ids) for o in step.outputs)


class Generation:
    def __init__(self, engine, request_id: str, prompts: list[list[int]], params: SamplingParams,
                 tracker=None, **generate_kwargs):
        self.engine = engine
        self.tracker = tracker  # metrics.RequestTracker, or None
        self.request_id = request_id
        self.prompts = prompts
        self.params = params
        self.n = params.n
        self.generate_kwargs = generate_kwargs
        self.counts = Counts()
        self._iters: list[AsyncIterator[RequestOutput]] = []
        self._first: list[RequestOutput] = []
        self.finished = False

    async def start(self) -> None:
        """Submit every prompt and wait for each one's first step, so that bad input
        raises `InvalidRequest` here, before a response starts."""
        if self.tracker:
            self.tracker.submitted()
        try:
            # Issue 5: compile the grammar (cached by schema) on a worker thread, so that
            # neither the event loop nor the engine loop waits for it; refusals are 422s.
            core = getattr(self.engine, "engine", None)
            if self.params.structured_output is not None and core is not None:
                await asyncio.to_thread(core.compile_structured_output, self.params)
            for i, ids in enumerate(self.prompts):
                rid = self.request_id if len(self.prompts) == 1 else f"{self.request_id}-{i}"
                it = aiter(self.engine.generate(rid, ids, self.params, **self.generate_kwargs))
                self._iters.append(it)
            for i, it in enumerate(self._iters):
                self._first.append(await anext(it))
                self.counts.set_prompt(i, self._first[-1])
                if self.tracker and self._first[-1].queued_seconds is not None:
                    self.tracker.scheduled(self._first[-1].queued_seconds)
        except RequestError as err:
            await self.aclose(failed=True)
            raise InvalidRequest.from_request_error(err) from None
        except EngineDeadError as err:
            await self.aclose(failed=True)
            raise EngineUnavailable(str(err)) from None
        except BaseException:  # cancelled: the client left while it queued
            await self.aclose()
            raise

    async def steps(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, step) in arrival order across prompts; keeps usage and
        metrics current."""
        try:
            if len(self._iters) == 1:
                source = ((0, step) async for step in self._one(0))
            else:
                source = self._merged()
            async for i, step in source:
                self.counts.update(i, step)
                if self.tracker:
                    self.tracker.tokens(sum(len(o.new_token_ids) for o in step.outputs))
                yield i, step
            self.finished = True
        finally:
            await self.aclose()

    async def outputs(self) -> AsyncIterator[tuple[int, CompletionOutput]]:
        """(wire choice index, delta) for every choice that moved, in order."""
        async for i, step in self.steps():
            for out in step.outputs:
                yield i * self.n + out.index, out

    async def _one(self, i: int) -> AsyncIterator[RequestOutput]:
        first = self._first[i]
        yield first
        if first.finished:
            return
        async for step in self._iters[i]:
            yield step
            if step.finished:
                return

    async def _merged(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        queue: asyncio.Queue = asyncio.Queue()
        done = object()

        async def pump(i: int) -> None:
            try:
                async for step in self._one(i):
                    await queue.put((i, step))
                await queue.put((i, done))
            except BaseException as err:  # noqa: BLE001 - forwarded to the consumer
                await queue.put((i, err))

        tasks = [asyncio.create_task(pump(i)) for i in range(len(self._iters))]
        try:
            remaining = len(tasks)
            while remaining:
                i, item = await queue.get()
                if item is done:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def aclose(self, failed: bool = False) -> None:
        """Closing an engine iterator aborts its request and frees its KV blocks."""
        if self.tracker:
            c = self.counts
            if failed:
                self.tracker.failed()
            elif self.finished:
                self.tracker.finished(c.prompt_tokens, c.completion_tokens, c.cached_tokens)
            else:
                self.tracker.cancelled()
        iters, self._iters = self._iters, []
        # Shielded: this runs while a disconnect is cancelling the response, and anyio
        # would otherwise cancel the abort itself at its first await.
        with anyio.CancelScope(shield=True):
            for it in iters:
                close = getattr(it, "aclose", None)
                if close is not None:
                    try:
                        await close()
                    except Exception:  # noqa: BLE001 - closing must not mask the outcome
                        log.exception("closing engine request %s", self.request_id)


async def run_unless_disconnected(request, coro):
    """Run `coro` (a non-streaming generation) but cancel it if the client hangs up, so
    a departed client's request stops using the engine at once."""
    task = asyncio.ensure_future(coro)

    async def wait_disconnect():
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(wait_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise ClientDisconnected()
    return task.result()


class ClientDisconnected(Exception):
    pass


class EngineUnavailable(Exception):
    """The engine loop is not running (it failed or is shutting down): a 503."""
