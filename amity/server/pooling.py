"""One wire request's run of pooling inputs (embeddings, classification) on the engine.

The inputs are tokenized and validated together off the event loop (a bad one is a
422 naming it, `input[i]`, before anything is queued), then queued in one event-loop
turn, so they enter the engine's steps together as one batch, and answered in order.
A client that hangs up aborts whatever is still queued or running.
"""

import asyncio

import anyio

from amity.engine.client import EngineClient, EngineDeadError
from amity.engine.errors import RequestError
from amity.engine.outputs import PoolingOutput
from amity.engine.pooling_params import PoolingParams
from amity.server.errors import EngineUnavailable
from amity.server.generation import new_id, run_unless_disconnected
from amity.server.pooling_schemas import PoolingBody
from amity.server.protocol import InvalidRequest
from amity.server.state import ServerState


def prepare_inputs(engine: EngineClient, body: PoolingBody, params: PoolingParams) -> list[object]:
    """Each input's token ids, checked by the engine; InvalidRequest names the input."""
    if body.tokens is not None:
        items = [(body.tokens, ["tokens"])]
    elif isinstance(body.input, str):
        items = [(engine.encode_input(body.input), ["input"])]
    else:
        items = [(engine.encode_input(text), ["input", i]) for i, text in enumerate(body.input)]
    prepared = []
    for ids, loc in items:
        try:
            prepared.append(engine.validate_pooling(ids, params))
        except RequestError as err:
            raise InvalidRequest(err.message, loc if err.field in ("input", "tokens") else [err.field]) from None
    return prepared


async def run_pooling(request, state: ServerState, engine: EngineClient, body: PoolingBody,
                      params: PoolingParams) -> list[PoolingOutput]:
    prepared = await state.off_loop(prepare_inputs, engine, body, params)
    tracker = state.admit(len(prepared))
    tracker.submitted()
    request_id = new_id("pool")
    streams = []
    try:
        for i, item in enumerate(prepared):
            streams.append(engine.pool(f"{request_id}-{i}", item))
        outputs = await run_unless_disconnected(request, asyncio.gather(*(anext(s) for s in streams)))
    except EngineDeadError as err:
        tracker.errored()
        raise EngineUnavailable(str(err)) from None
    except Exception:
        tracker.errored()
        raise
    except BaseException:
        tracker.cancelled()
        raise
    finally:
        with anyio.CancelScope(shield=True):  # abort what still runs, even while cancelled
            for stream in streams:
                await stream.aclose()
    tracker.finished(sum(o.num_prompt_tokens for o in outputs), 0, sum(o.num_cached_tokens for o in outputs))
    return outputs
