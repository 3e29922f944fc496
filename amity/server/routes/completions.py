"""POST /v1/completions: text in (a prompt, several prompts, or token ids), text out."""

import time

from fastapi import APIRouter, Request

from amity.engine.outputs import FinalOutput
from amity.server import protocol
from amity.server import schemas as s
from amity.server.errors import error_responses
from amity.server.generation import Generation, start_generation
from amity.server.sse import DONE, SSEResponse, data_frame
from amity.server.state import ServerState, state_of

router = APIRouter()

STREAM_DOC = {
    "content": {"text/event-stream": {"schema": s.StreamedCompletionData.model_json_schema()}},
    "description": "With `stream: true`: `data:` chunks, then `data: [DONE]`.",
}


@router.post(
    "/v1/completions",
    response_model=s.CompletionsSuccess,
    responses={200: STREAM_DOC, **error_responses()},
)
async def completions(body: s.CompletionsBody, request: Request):
    state = state_of(request)
    engine = state.resolve_model(body.model)
    prompts, params = await state.off_loop(protocol.completions_request, body, state.info)
    gen = await start_generation(
        request, state, engine, "cmpl", prompts, params,
        embedding_to_replace=body.embedding_to_replace,
        token_index_to_replace=body.token_index_to_replace,
    )
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return SSEResponse(_stream(gen, state, include_usage), gen.aclose)
    return await gen.respond(request, _collect(gen, state))


async def _collect(gen: Generation, state: ServerState) -> s.CompletionsSuccess:
    finals: dict[int, FinalOutput] = {}
    async for i, step in gen.steps():
        finals.setdefault(i, FinalOutput(step.request_id)).add(step)
    choices = []
    for i in sorted(finals):
        for c in finals[i].ordered_choices:
            logprobs = None
            if c.logprobs is not None:
                logprobs = protocol.completions_logprobs(c.logprobs, state.pieces, 0)
            choices.append(s.CompletionsChoice(
                index=i * gen.n + c.index, text=c.text, tokens=c.token_ids, seed=c.seed,
                finish_reason=c.finish_reason, logprobs=logprobs,
            ))
    counts = gen.counts
    return s.CompletionsSuccess(
        id=gen.request_id, model=state.model_name, choices=choices,
        usage=protocol.usage(counts.prompt_tokens, counts.completion_tokens, counts.cached_tokens),
    )


async def _stream(gen: Generation, state: ServerState, include_usage: bool):
    """One chunk per token (the spec's `token` is a single id), the step's text on its
    last token; then, per choice, a final empty chunk with `finish_reason`."""
    created = int(time.time())
    offsets: dict[int, int] = {}

    def chunk(choice: s.StreamedCompletionsChoice) -> bytes:
        return data_frame(s.StreamedCompletionData(
            id=gen.request_id, model=state.model_name, created=created, choices=[choice]))

    async for index, out in gen.outputs():
        logprobs = out.new_logprobs or []
        tokens = out.new_token_ids or [None]
        for k, token in enumerate(tokens):
            lp = None
            if k < len(logprobs):
                lp = protocol.completions_logprobs([logprobs[k]], state.pieces, offsets.get(index, 0))
                offsets[index] = offsets.get(index, 0) + len(lp.tokens[0])
            text = out.new_text if k == len(tokens) - 1 else ""
            if text or token is not None:
                yield chunk(s.StreamedCompletionsChoice(index=index, text=text, token=token, logprobs=lp))
        if out.finish_reason is not None:
            yield chunk(s.StreamedCompletionsChoice(index=index, text="", finish_reason=out.finish_reason))
    if include_usage:
        c = gen.counts
        yield data_frame(s.StreamedCompletionData(
            id=gen.request_id, model=state.model_name, created=created, choices=[],
            usage=protocol.usage(c.prompt_tokens, c.completion_tokens, c.cached_tokens)))
    yield DONE
