"""Inference through the Suite: the 14 dedicated operations (`/dedicated/v1/...`,
`/dedicated/classify`) to an endpoint's replicas, and the container paths (`/v1/...`,
`/classify`, `/metrics`, `/health`) to the default model's container.

A dedicated request: authenticate; `model` is `ENDPOINT_ID` or
`ENDPOINT_ID:ADAPTER_ROUTE`, an endpoint of the caller's team (else 404); a sleeping
endpoint is woken and the request waits for it (bounded, then a 503 with
Retry-After); the replica with the fewest outstanding requests takes it, or it
waits in the endpoint's queue (bounded, then a 429). Replicas serve under the
endpoint id, so `model` in their answers is the endpoint id and the body goes
through unchanged, except for one rule (platform-notes §0.3): a body without a
`stream` field whose Accept header prefers `text/event-stream` over JSON streams
(friendli 0.12.8's `stream()` sends no `stream` field).
"""

import json

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from amity.suite.auth import Caller, caller
from amity.suite.endpoints.controller import InvalidTransition
from amity.suite.errors import ApiError, not_found
from amity.suite.replicas.pool import QueueTimeout
from amity.suite.replicas.proxy import forward, request_headers
from amity.suite.store.models import Endpoint

DEDICATED_PATHS = ("/v1/chat/completions", "/v1/chat/render", "/v1/messages", "/v1/completions",
                   "/v1/embeddings", "/v1/tokenize", "/v1/detokenize", "/v1/images/generations",
                   "/v1/images/edits", "/v1/audio/transcriptions", "/classify")
STREAMABLE = ("/v1/chat/completions", "/v1/completions", "/v1/audio/transcriptions")
DEFAULT_CONTAINER = "default"

dedicated = APIRouter(tags=["Dedicated.Inference"])
container = APIRouter(tags=["Container"])


def _accept_prefers_sse(accept: str) -> bool:
    weights = {}
    for item in accept.split(","):
        kind, *params = [p.strip() for p in item.split(";")]
        q = 1.0
        for param in params:
            if param.startswith("q="):
                try:
                    q = float(param[2:])
                except ValueError:
                    q = 0.0
        weights[kind.lower()] = q
    sse = weights.get("text/event-stream", 0.0)
    return sse > 0 and sse > max(weights.get("application/json", 0.0), weights.get("*/*", 0.0))


def _body_model(raw: bytes, content_type: str, path: str, accept: str) -> tuple[str, bytes]:
    """The `model` of a JSON body, and the body to forward."""
    if not content_type.startswith("application/json") and content_type:
        raise ApiError(415, "dedicated inference takes a JSON body", loc=("header", "Content-Type"),
                       type="unsupported_media_type")
    try:
        body = json.loads(raw)
    except ValueError:
        raise ApiError(422, "the body is not valid JSON", loc=("body",), type="json_invalid") from None
    if not isinstance(body, dict):
        raise ApiError(422, "the body is a JSON object", loc=("body",), type="model_attributes_type")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(422, "`model` is required: the endpoint id, or ENDPOINT_ID:ADAPTER_ROUTE",
                       loc=("body", "model"), type="missing")
    if path in STREAMABLE and "stream" not in body and _accept_prefers_sse(accept):
        body["stream"] = True
        raw = json.dumps(body, ensure_ascii=False).encode()
    return model, raw


def _team_endpoint_id(request: Request, who: Caller, model: str) -> str:
    endpoint_id = model.split(":", 1)[0]
    with request.app.state.sessions() as session:
        row = session.query(Endpoint).filter(Endpoint.id == endpoint_id).one_or_none()
        if row is None or row.team_id != who.team_id:
            raise not_found("endpoint", endpoint_id, ("body", "model"))
    return endpoint_id


def _dedicated_route(path: str):
    async def route(request: Request, who: Caller = Depends(caller)) -> Response:
        raw = await request.body()
        model, raw = _body_model(raw, request.headers.get("content-type", ""), path,
                                 request.headers.get("accept", ""))
        endpoint_id = _team_endpoint_id(request, who, model)
        controller, config = request.app.state.controller, request.app.state.config
        try:
            replicas = await controller.serving_set(endpoint_id, config.wake_timeout_s)
        except InvalidTransition as error:
            raise ApiError(400, str(error), loc=("body", "model"), type="invalid_state") from None
        except TimeoutError as error:
            raise ApiError(503, f"{error}; retry shortly", loc=("body", "model"), type="not_ready",
                           headers={"Retry-After": "5"}) from None
        try:
            replica = await replicas.acquire(config.queue_timeout_s)
        except QueueTimeout as error:
            raise ApiError(429, str(error), loc=("body", "model"), type="queue_timeout") from None
        headers = request_headers(request, drop=("authorization", "x-friendli-team", "accept-encoding"))
        return await forward(request.app.state.replicas.client, replica.url + path, request, raw,
                             lambda: replicas.release(replica), headers)

    name = path.strip("/").replace("/", "_")
    dedicated.post("/dedicated" + path, operation_id=f"dedicated_{name}", summary=f"{path} of a dedicated endpoint",
                   openapi_extra={"requestBody": {"required": True, "content": {
                       "application/json": {"schema": {"type": "object", "required": ["model"],
                                                       "properties": {"model": {"type": "string"}}}}}}},
                   )(route)


for _path in DEDICATED_PATHS:
    _dedicated_route(_path)


async def _to_container(request: Request, path: str) -> Response:
    manager = request.app.state.replicas
    named = manager.named.get(DEFAULT_CONTAINER)
    if named is None or not named[0].replicas:
        failure = manager.failures.get(DEFAULT_CONTAINER)
        if request.app.state.config.container_model == "none":
            raise ApiError(404, "this Suite runs no container (--container-model none); use the "
                           "dedicated endpoints", type="not_found")
        if failure:
            return JSONResponse({"detail": [{"loc": [], "msg": f"the container failed: {failure}",
                                             "type": "container_failed"}]}, status_code=500)
        return JSONResponse({"detail": [{"loc": [], "msg": "the container is still loading; retry "
                                         "shortly", "type": "not_ready"}]}, status_code=503,
                            headers={"Retry-After": "5"})
    replicas = named[0]
    try:
        replica = await replicas.acquire(request.app.state.config.queue_timeout_s)
    except QueueTimeout as error:
        raise ApiError(429, str(error), type="queue_timeout") from None
    return await forward(manager.client, replica.url + path, request, request.stream(),
                         lambda: replicas.release(replica))


@container.api_route("/v1/{rest:path}", methods=["GET", "POST"], include_in_schema=False)
async def container_v1(request: Request, rest: str) -> Response:
    return await _to_container(request, "/v1/" + rest)


@container.api_route("/classify", methods=["POST"], include_in_schema=False)
async def container_classify(request: Request) -> Response:
    return await _to_container(request, "/classify")


@container.get("/health", tags=["Health"])
async def health(request: Request) -> Response:
    """The container's own health (503 while it loads) when the Suite runs one;
    otherwise the Suite's: it answers."""
    if request.app.state.config.container_model == "none":
        return JSONResponse({"status": "ok"})
    return await _to_container(request, "/health")


@container.get("/metrics", include_in_schema=False)
async def container_metrics(request: Request) -> Response:
    return await _to_container(request, "/metrics")
