"""Inference through the Suite: the 14 dedicated operations (`/dedicated/v1/...`,
`/dedicated/classify`) to an endpoint's replicas, and the container paths (`/v1/...`,
`/classify`, `/metrics`, `/health`) to the default model's container.

A dedicated request: authenticate; `model` is `ENDPOINT_ID` or
`ENDPOINT_ID:ADAPTER_ROUTE`, an endpoint of the caller's team (else 404); a sleeping
endpoint is woken and the request waits for it (bounded, then a 503 with
Retry-After); the replica with the fewest outstanding requests takes it, or it
waits in the endpoint's queue (bounded, then a 429). Replicas serve under the
endpoint id, so `model` in their answers is the endpoint id and the body goes
through unchanged (a multipart one streamed, inference_body.py), except for the
Accept rule of platform-notes §0.3 (friendli 0.12.8's `stream()` sends no `stream`
field) and the dedicated image shapes (dedicated_images.py).
"""

from collections.abc import AsyncIterable, Callable

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from amity.suite.auth import Caller, caller
from amity.suite.endpoints.controller import InvalidTransition
from amity.suite.errors import ApiError, not_found
from amity.suite.inference_body import read_inference_body
from amity.suite.replicas.pool import Lease, QueueTimeout, ReplicaSet
from amity.suite.replicas.proxy import forward, request_headers

DEDICATED_PATHS = ("/v1/chat/completions", "/v1/chat/render", "/v1/messages", "/v1/completions",
                   "/v1/embeddings", "/v1/tokenize", "/v1/detokenize", "/v1/images/generations",
                   "/v1/images/edits", "/v1/audio/transcriptions", "/classify")
DEFAULT_CONTAINER = "default"

dedicated = APIRouter(tags=["Dedicated.Inference"])
container = APIRouter(tags=["Container"])


async def relay(request: Request, lease: Lease, path: str, body: bytes | AsyncIterable[bytes],
                rewrite: Callable[[bytes], bytes] | None = None) -> Response:
    """Forward an inference request to the leased replica, its answer streamed back
    (a 200 through `rewrite` when given); the lease ends with the exchange. The
    caller's credentials stay here. A body that goes on unchanged (streamed) keeps
    its length; one rewritten gets a new one."""
    headers = request_headers(request, drop=("authorization", "x-friendli-team", "accept-encoding")) + (
        [(b"content-length", request.headers["content-length"].encode("latin-1"))]
        if not isinstance(body, bytes) and "content-length" in request.headers else [])
    return await forward(lease.client, lease.url + path, request, body,
                         lease.release, headers, rewrite)


async def reserve(replicas: ReplicaSet, queue_timeout_s: float) -> Lease:
    """A slot on one of `replicas`, or a 429 once the queue wait runs out."""
    try:
        return await replicas.lease(queue_timeout_s)
    except QueueTimeout as error:
        raise queue_full(error) from None


def queue_full(error: QueueTimeout) -> ApiError:
    return ApiError(429, str(error), loc=("body", "model"), type="queue_timeout")


def not_ready(error: Exception) -> ApiError:
    """Replicas that did not get ready within the wait: a 503 the client may retry."""
    return ApiError(503, f"{error}; retry shortly", loc=("body", "model"), type="not_ready",
                    headers={"Retry-After": "5"})


def _team_endpoint_id(request: Request, who: Caller, model: str) -> str:
    # The controller tracks every endpoint with its team: no database session here,
    # in the event loop (a session waiting for a pooled connection would block the
    # loop, and with it the requests that would give connections back).
    endpoint_id = model.split(":", 1)[0]
    live = request.app.state.controller.live.get(endpoint_id)
    if live is None or live.team_id != who.team_id:
        raise not_found("endpoint", endpoint_id, ("body", "model"))
    return endpoint_id


def _dedicated_route(path: str):
    async def route(request: Request, who: Caller = Depends(caller)) -> Response:
        model, body, rewrite = await read_inference_body(
            request, path, "the endpoint id, or ENDPOINT_ID:ADAPTER_ROUTE")
        endpoint_id = _team_endpoint_id(request, who, model)
        controller, config = request.app.state.controller, request.app.state.config
        try:
            replicas = await controller.serving_set(endpoint_id, config.wake_timeout_s)
        except InvalidTransition as error:
            raise ApiError(400, str(error), loc=("body", "model"), type="invalid_state") from None
        except TimeoutError as error:
            raise not_ready(error) from None
        return await relay(request, await reserve(replicas, config.queue_timeout_s), path, body, rewrite)

    name = path.strip("/").replace("/", "_")
    media_type = "multipart/form-data" if path == "/v1/audio/transcriptions" else "application/json"
    dedicated.post("/dedicated" + path, operation_id=f"dedicated_{name}", summary=f"{path} of a dedicated endpoint",
                   openapi_extra={"requestBody": {"required": True, "content": {
                       media_type: {"schema": {"type": "object", "required": ["model"],
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
    return await forward(replica.client, replica.url + path, request, request.stream(),
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
