"""One wire request's run on the engine, for every API.

A wire request may be several engine requests (a completions `prompt` list: each
prompt is its own engine request with its own `n` choices, indexed as OpenAI does:
prompt i's choice j is choice i * n + j). `Generation` validates them all, submits
them together (so they prefill in the same steps), surfaces their `RequestError`s
before any response byte is sent (so a bad request is a 422, not a broken stream),
merges their deltas into one stream, and aborts whatever is still running when it is
closed: on a finished response, a client hang-up or an error. How it ended goes to
the metrics: finished, bad input, a failure of the server, or a cancel.
"""

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import anyio

from amity.engine.client import EngineClient, EngineDeadError
from amity.engine.errors import RequestError
from amity.engine.outputs import CompletionOutput, RequestOutput
from amity.engine.sampling_params import SamplingParams
from amity.server import protocol
from amity.server.errors import ClientDisconnected, EngineUnavailable
from amity.server.protocol import InvalidRequest
from amity.server.state import ServerState

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


def _server_side(error: Exception) -> Exception:
    """An engine failure as the server reports it: a dead engine is a 503."""
    if isinstance(error, EngineDeadError):
        return EngineUnavailable(str(error))
    return error


class Generation:
    def __init__(self, engine: EngineClient, request_id: str, prompts: list[list[int]],
                 params: SamplingParams, tracker=None, **generate_kwargs):
        self.engine = engine
        self.tracker = tracker  # metrics.RequestTracker, or None
        self.request_id = request_id
        self.prompts = prompts
        self.params = params
        self.n = params.n
        self.generate_kwargs = generate_kwargs  # validate()'s keywords
        self.counts = Counts()
        self._iters: list[AsyncIterator[RequestOutput]] = []
        self._first: list[RequestOutput] = []
        self.prepared: list[object] = []  # what validate() made of each prompt
        self.finished = False

    async def start(self) -> None:
        """Validate every prompt, submit them all at once and wait for each one's first
        step, so that bad input raises `InvalidRequest` here, before a response starts."""
        if self.tracker:
            self.tracker.submitted()
        try:
            # Off the event loop and the engine thread: validation compiles the grammar.
            self.prepared = prepared = [await self.engine.validate(ids, self.params, **self.generate_kwargs)
                                        for ids in self.prompts]
            for i, request in enumerate(prepared):
                rid = self.request_id if len(self.prompts) == 1 else f"{self.request_id}-{i}"
                self._iters.append(self.engine.generate(rid, request))
            firsts = [asyncio.ensure_future(anext(it)) for it in self._iters]
            try:
                self._first = list(await asyncio.gather(*firsts))
            finally:
                for f in firsts:
                    f.cancel()
            for i, first in enumerate(self._first):
                self.counts.set_prompt(i, first)
                if self.tracker and first.queued_seconds is not None:
                    self.tracker.scheduled(first.queued_seconds)
        except RequestError as err:
            await self.aclose(err)
            raise InvalidRequest.from_request_error(err) from None
        except Exception as err:
            await self.aclose(err)
            raise _server_side(err) from None
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
        except Exception as err:
            await self.aclose(err)
            raise _server_side(err) from None
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

    async def respond(self, request, coro):
        """Run a non-streaming response (`coro`, which reads `steps()`), cancelled if the
        client hangs up; the generation is closed however that ends."""
        try:
            return await run_unless_disconnected(request, coro)
        except Exception as err:
            await self.aclose(err)
            raise
        finally:
            await self.aclose()

    async def aclose(self, error: BaseException | None = None) -> None:
        """Close the engine streams (aborting what still runs, freeing its KV blocks)
        and record how the generation ended; only the first call counts. `error`: what
        ended it, None for a finished run or a cancel."""
        if self.tracker:
            c = self.counts
            if self.finished:
                self.tracker.finished(c.prompt_tokens, c.completion_tokens, c.cached_tokens)
            elif isinstance(error, (RequestError, InvalidRequest)):
                self.tracker.invalid()
            elif error is not None and not isinstance(error, ClientDisconnected):
                self.tracker.errored()
            else:
                self.tracker.cancelled()
        iters, self._iters = self._iters, []
        # Shielded: this runs while a disconnect is cancelling the response, and anyio
        # would otherwise cancel the abort itself at its first await.
        with anyio.CancelScope(shield=True):
            for it in iters:
                try:
                    await it.aclose()
                except Exception:  # noqa: BLE001 - closing must not mask the outcome
                    log.exception("closing engine request %s", self.request_id)


async def start_generation(request, state: ServerState, engine: EngineClient, prefix: str,
                           prompts: list[list[int]], params: SamplingParams, **kwargs) -> Generation:
    """Admit, validate, submit and wait for the first step (bad input raises a 422
    here): the same start for every generating API. `engine` is what `resolve_model`
    returned."""
    protocol.check_num_choices(len(prompts), params.n)
    gen = Generation(engine, new_id(prefix), prompts, params,
                     tracker=state.admit(len(prompts) * params.n), **kwargs)
    try:
        await run_unless_disconnected(request, gen.start())
    except BaseException as err:  # start() closes itself, unless it never ran
        await gen.aclose(err if isinstance(err, Exception) else None)
        raise
    return gen


async def run_unless_disconnected(request, coro):
    """Run `coro` but cancel it if the client hangs up, so a departed client's request
    stops using the engine at once."""
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
