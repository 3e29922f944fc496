"""The 10 serverless inference operations (`/serverless/v1/...`: chat and completions
plain and streamed, messages, chat render, tokenize, detokenize, audio transcriptions
plain and streamed): authenticated as dedicated inference; `model` is a catalog id
(unknown: 404), served by that model's shared replicas (ServerlessReplicas). The body
goes through unchanged, but for the Accept rule (platform-notes §0.3), and the answer
streams back, exactly as the dedicated router does it (inference_body.read_inference_body, router.relay).
"""

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from amity.suite.auth import Caller, caller
from amity.suite.errors import ApiError
from amity.suite.replicas.pool import Lease, QueueTimeout
from amity.suite.inference_body import read_inference_body
from amity.suite.router import not_ready, queue_full, relay
from amity.suite.serverless.catalog import CatalogEntry
from amity.suite.serverless.endpoints import SharedModel, StartFailed

PATHS = ("/v1/chat/completions", "/v1/chat/render", "/v1/messages", "/v1/completions",
         "/v1/tokenize", "/v1/detokenize", "/v1/audio/transcriptions")
router = APIRouter(tags=["Serverless.Inference"])


def catalog_model(request: Request, model: str) -> CatalogEntry:
    entry = request.app.state.catalog.get(model)
    if entry is None:
        # The catalog is the same for every team; "in this team" would mislead.
        raise ApiError(404, f"no serverless model {model!r} in the catalog "
                            "(GET /serverless/v1/models lists them)", loc=("body", "model"),
                       type="not_found")
    return entry


async def lease(request: Request, entry: SharedModel) -> Lease:
    """A slot on a replica of `entry`, with the replica failures as HTTP errors."""
    try:
        return await request.app.state.serverless.lease(entry)
    except TimeoutError as error:
        raise not_ready(error) from None
    except StartFailed as error:
        raise ApiError(503, str(error), loc=("body", "model"), type="start_failed") from None
    except QueueTimeout as error:
        raise queue_full(error) from None


def _route(path: str):
    async def route(request: Request, who: Caller = Depends(caller)) -> Response:
        model, body, rewrite = await read_inference_body(request, path, "a serverless model's catalog id")
        entry = catalog_model(request, model)
        return await relay(request, await lease(request, entry), path, body, rewrite)

    name = path.strip("/").replace("/", "_")
    content = {"application/json": {"schema": {
        "type": "object", "required": ["model"], "properties": {"model": {"type": "string"}}}}}
    if path == "/v1/audio/transcriptions":
        content = {"multipart/form-data": {"schema": {
            "type": "object", "required": ["model", "file"],
            "properties": {"model": {"type": "string"},
                           "file": {"type": "string", "format": "binary"}}}}}
    router.post("/serverless" + path, operation_id=f"serverless_{name}",
                summary=f"{path} of a serverless model",
                openapi_extra={"requestBody": {"required": True, "content": content}})(route)


for _path in PATHS:
    _route(_path)
