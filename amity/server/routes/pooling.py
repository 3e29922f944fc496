"""POST /v1/embeddings and POST /classify: a vector, or class probabilities, per input."""

import base64
import time

import torch
from fastapi import APIRouter, Request

from amity.engine.pooling_params import PoolingParams
from amity.server import pooling_schemas as ps
from amity.server.errors import error_responses
from amity.server.generation import new_id
from amity.server.pooling import run_pooling
from amity.server.protocol import usage
from amity.server.state import state_of

router = APIRouter()

# The spec's embeddings operation is the dedicated one; a container serves it here,
# where OpenAI clients (and the Suite's dedicated route) send it.
EMBED_DOC = "Embeddings: one vector per input, in order (`float`, or `base64` little-endian float32)."
CLASSIFY_DOC = "Text classification: each input's label and softmax probabilities in label-id order."


def _encode(vector: torch.Tensor, encoding_format: str | None) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


@router.post("/v1/embeddings", response_model=ps.EmbeddingsSuccess, responses=error_responses(),
             description=EMBED_DOC)
async def embeddings(body: ps.EmbeddingsBody, request: Request):
    state = state_of(request)
    engine = state.resolve_model(body.model)
    outputs = await run_pooling(request, state, engine, body, PoolingParams("embed"))
    prompt_tokens = sum(o.num_prompt_tokens for o in outputs)
    return ps.EmbeddingsSuccess(
        id=new_id("embd"), model=state.model_name, created=int(time.time()),
        data=[ps.EmbeddingObject(index=i, embedding=_encode(o.data, body.encoding_format))
              for i, o in enumerate(outputs)],
        usage=usage(prompt_tokens, 0, sum(o.num_cached_tokens for o in outputs)))


@router.post("/classify", response_model=ps.ClassificationSuccess, responses=error_responses(),
             description=CLASSIFY_DOC)
async def classify(body: ps.PoolingBody, request: Request):
    state = state_of(request)
    engine = state.resolve_model(body.model)
    outputs = await run_pooling(request, state, engine, body, PoolingParams("classify"))
    labels = engine.labels
    data = []
    for i, o in enumerate(outputs):
        probs = o.data.tolist()
        data.append(ps.ClassificationData(index=i, label=labels[int(o.data.argmax())],
                                          num_classes=len(probs), probs=probs))
    prompt_tokens = sum(o.num_prompt_tokens for o in outputs)
    return ps.ClassificationSuccess(
        data=data, usage=ps.ClassificationUsage(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens))
