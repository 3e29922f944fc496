"""POST /v1/tokenize and POST /v1/detokenize."""

from fastapi import APIRouter, Request

from amity.server import schemas as s
from amity.server.errors import error_responses
from amity.server.protocol import check_token_ids
from amity.server.state import state_of

router = APIRouter()


@router.post("/v1/tokenize", response_model=s.TokenizationSuccess,
             responses=error_responses())
async def tokenize(body: s.TokenizationBody, request: Request):
    state = state_of(request)
    state.resolve_model(body.model)
    # The same call /v1/completions makes, so `usage.prompt_tokens` matches this count.
    return s.TokenizationSuccess(tokens=await state.off_loop(state.info.tokenizer.encode, body.prompt))


@router.post("/v1/detokenize", response_model=s.DetokenizationSuccess,
             responses=error_responses())
async def detokenize(body: s.DetokenizationBody, request: Request):
    state = state_of(request)
    state.resolve_model(body.model)
    check_token_ids(body.tokens, state.info.vocab_size, ["tokens"])
    return s.DetokenizationSuccess(text=await state.off_loop(state.info.tokenizer.decode, body.tokens))
