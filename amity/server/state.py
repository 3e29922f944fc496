"""What the routes share: the served model, its engine client, admission, metrics.

Admission counts what the server itself has admitted and not yet finished (the
`friendli_current_requests` gauge, kept on the event loop where requests arrive), not
a sample of the engine's queue read from another thread: past
`ServerConfig.max_queue_len` requests in flight a new one gets a 503, however fast
they arrive.
"""

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import Request

from amity.config import ServerConfig
from amity.engine.client import AdapterClient, EngineClient
from amity.images.inputs import FetchPolicy
from amity.images.service import ImageService
from amity.server.adapter_route import AdapterRoute
from amity.server.errors import ApiError
from amity.server.metrics import RequestTracker, ServerMetrics
from amity.server.protocol import ModelInfo, TokenPieces


@dataclass
class ServerState:
    config: ServerConfig
    engine: EngineClient | None = None
    model_name: str = ""
    info: ModelInfo | None = None
    pieces: TokenPieces | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    metrics: ServerMetrics | None = None
    load_error: str | None = None
    # An image model is served by an image service instead of an engine (one or the other).
    images: ImageService | None = None
    image_fetch: FetchPolicy = field(default_factory=FetchPolicy)
    # Tokenization and chat templating, off the event loop (a 1 MB prompt must not
    # stall every stream); one thread, as a fast tokenizer is not safe to share.
    _preprocessor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="amity-tokenize"))

    def __post_init__(self):
        if self.metrics is None:
            self.metrics = ServerMetrics(lambda: self.engine.stats() if self.engine else None)
        self.image_fetch = FetchPolicy.from_flags(self.config.image_fetch_allow,
                                                  self.config.image_fetch_timeout)

    def attach(self, engine: EngineClient) -> None:
        """Make a loaded engine servable (it may arrive after the server is up)."""
        self.model_name = self.config.served_model_name or engine.model_name
        self.info = ModelInfo(engine.tokenizer, engine.vocab_size, engine.max_model_len)
        self.pieces = TokenPieces(engine.tokenizer)
        self.engine = engine

    def attach_images(self, service: ImageService) -> None:
        from amity.server.image_metrics import ImageMetrics

        self.model_name = self.config.served_model_name or service.model_name
        self.metrics.registry.register(ImageMetrics(service.stats))
        self.images = service

    def _refuse_task(self, served: str, asked: str) -> None:
        # vLLM answers a route its model does not serve with a 400 likewise.
        raise ApiError(400, f"model {self.model_name!r} serves {served}; this route needs a "
                            f"{asked} model", loc=(), type="unsupported_task")

    def resolve_images(self, name: str | None) -> ImageService:
        """The image service for a request naming `model` (as resolve_model)."""
        if self.engine is not None:
            self._refuse_task("text generation", "image-generation")
        if self.images is None:
            self.ready_engine()
        self._check_name(name)
        return self.images

    def ready_engine(self) -> EngineClient:
        if self.images is not None:
            self._refuse_task(self.images.pipelines.task, "text-generation")
        if self.engine is None:
            raise ApiError(503, "the model is still loading; retry shortly", type="not_ready",
                           headers={"Retry-After": "5"})
        return self.engine

    def adapters(self) -> dict[str, str]:
        """The LoRA adapters served now: route -> path."""
        engine = self.ready_engine()
        return engine.lora_adapters() if isinstance(engine, AdapterClient) else {}

    def resolve_model(self, name: str | None) -> EngineClient:
        """What serves a request naming `model`: the one place the field is interpreted.
        The base model's name (or none) is the base; a LoRA adapter's route, alone or
        as `BASE:ROUTE` (a dedicated endpoint's `ENDPOINT_ID:ADAPTER_ROUTE` form), is
        the base computing with that adapter."""
        engine = self.ready_engine()
        if name is None or name == self.model_name:
            return engine
        adapters = self.adapters()
        route = name.removeprefix(f"{self.model_name}:")
        if route in adapters:
            return AdapterRoute(engine, route)
        served = ", ".join(repr(m) for m in [self.model_name, *adapters])
        raise ApiError(
            404, f"model {name!r} is not served here; served: {served} (or leave `model` out)",
            loc=("body", "model"), type="model_not_found",
        )

    def _check_name(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise ApiError(
                404,
                f"model {name!r} is not served here; use {self.model_name!r} or leave `model` out",
                loc=("body", "model"), type="model_not_found",
            )

    def admit(self, num_items: int) -> RequestTracker:
        """Admit a generation of `num_items` choices, or refuse it once the limit of
        requests in flight is reached. The tracker's close ends its admission."""
        in_flight = self.metrics.counts.current_requests
        if in_flight >= self.config.max_queue_len:
            self.metrics.reject()
            raise ApiError(
                503,
                f"the server is saturated: {in_flight} requests are in flight "
                f"(limit {self.config.max_queue_len}); retry later",
                loc=(), type="overloaded", headers={"Retry-After": "1"},
            )
        return self.metrics.track(num_items)

    async def off_loop(self, fn, *args):
        """`fn(*args)` on the preprocessing thread."""
        return await asyncio.get_running_loop().run_in_executor(self._preprocessor, fn, *args)


def state_of(request: Request) -> ServerState:
    return request.app.state.amity
