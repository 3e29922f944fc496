"""The engine client: everything a front end (the HTTP server, later the Suite) may ask
of an engine, and the errors it may get back.

The server depends on this protocol only, never on `LLMEngine`: an engine is a set of
model facts, a validation step and per-request output streams. `AsyncEngine`
implements it; another engine (several models, adapters, a pooling model, a remote
engine) can stand behind the same server by implementing it too.

A request's life: `validate` checks it and prepares it (compiling its grammar) off
both the event loop and the engine thread, raising `RequestError` for what the
client must change; `generate` queues the prepared request at once and returns its
per-step outputs. A pooling request (embed, classify) is the same life through
`validate_pooling` and `pool`: one `PoolingOutput`. Requests queued in the same event-loop turn reach the engine
together, so their prompts prefill in the same steps. Closing the stream early (or
`abort`) stops the request and frees its KV blocks.
"""

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from amity.engine.outputs import PoolingOutput, RequestOutput
from amity.engine.pooling_params import PoolingParams
from amity.engine.sampling_params import SamplingParams
from amity.models.tokenizer import Tokenizer


class EngineError(RuntimeError):
    """The engine failed a request it had accepted (a step raised): the server's
    fault, never the client's."""


class EngineDeadError(EngineError):
    """The engine loop is not running (it died, or shut down): every request in
    flight ends with this, and no new one is accepted."""


@runtime_checkable
class EngineClient(Protocol):
    # What the server reads of the model.
    @property
    def tokenizer(self) -> Tokenizer: ...
    @property
    def model_name(self) -> str: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def is_encoder_decoder(self) -> bool: ...
    @property
    def task(self) -> str:
        """What the model serves: "generate", "embed" or "classify" (server/tasks.py)."""
    @property
    def labels(self) -> list[str] | None:
        """A classifier's label of each class id; None otherwise."""

    def encode_input(self, text: str) -> list[int]:
        """The token ids of one pooling input, as the model's preprocessing makes them."""

    async def start(self) -> None:
        """Start serving (called once, from the event loop that will consume outputs)."""

    async def shutdown(self) -> None:
        """Stop; every stream still open ends with `EngineDeadError`. Idempotent."""

    def is_healthy(self) -> bool:
        """False once the engine can no longer serve (its loop died or shut down)."""

    def stats(self) -> dict:
        """Counters for /metrics: num_running, num_waiting, num_free_blocks, ..."""

    async def validate(self, prompt_token_ids: list[int], params: SamplingParams, *,
                       embedding_to_replace: list[float] | None = None,
                       token_index_to_replace: list[int] | None = None) -> object:
        """The request, checked and prepared for `generate` (opaque to the caller);
        `RequestError` names the field to change."""

    def generate(self, request_id: str, prepared: object) -> AsyncIterator[RequestOutput]:
        """Queue `prepared` (from `validate`) now and return its outputs, ending with
        one whose `finished` is set. Raises `EngineDeadError` when the engine is not
        running; the stream raises `EngineError` if the engine fails the request.
        Its `aclose()` before the end aborts the request."""

    def validate_pooling(self, prompt_token_ids: list[int], params: PoolingParams) -> object:
        """A pooling input, checked (cheaply, on any thread) and prepared for `pool`;
        `RequestError` names the field to change."""

    def pool(self, request_id: str, prepared: object) -> AsyncIterator[PoolingOutput]:
        """Queue `prepared` (from `validate_pooling`) now; its stream yields one
        `PoolingOutput`. Otherwise as `generate`."""

    async def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends without a finished output."""


@runtime_checkable
class AdapterClient(Protocol):
    """An engine that serves LoRA adapters over its base model: a request computes
    with one when its `SamplingParams.adapter` names its route. Load and unload
    raise `AdapterError` (models/peft_adapter.py; `AdapterNotFound` and `AdapterInUse`
    in engine/lora_manager.py say which) for what the client must change."""

    def lora_adapters(self) -> dict[str, str]:
        """Route -> the path it was loaded from, of every adapter served now."""

    async def load_lora_adapter(self, route: str, path: str) -> None: ...

    async def unload_lora_adapter(self, route: str) -> None: ...
