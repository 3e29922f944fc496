"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter: an amity extension with
vLLM's names and bodies (`lora_name`, `lora_path`), not in the Friendli spec.

Loading reads and checks the PEFT directory, then the adapter is served as route
`lora_name` (a request's `model`). As in vLLM, success is a plain-text 200; a bad
adapter or a name already loaded is a 400, an unknown name to unload a 404. An
adapter with requests in flight is not unloaded (409): its requests finish first.
"""

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import Field

from amity.engine.client import AdapterClient
from amity.engine.lora_manager import AdapterInUse, AdapterNotFound
from amity.models.peft_adapter import AdapterError
from amity.server import schemas as s
from amity.server.errors import ApiError, error_responses
from amity.server.state import ServerState, state_of

router = APIRouter()
RESPONSES = {
    **error_responses(),
    400: {"model": s.HTTPValidationError, "description": "A bad adapter, a name already loaded, all "
                                                         "--max-loras slots taken, or LoRA not enabled."},
    409: {"model": s.HTTPValidationError, "description": "The adapter has requests in flight."},
}


class LoadLoraAdapterBody(s.RequestModel):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoraAdapterBody(s.RequestModel):
    lora_name: str = Field(min_length=1)


def _adapter_engine(state: ServerState) -> AdapterClient:
    engine = state.ready_engine()
    if not isinstance(engine, AdapterClient):
        raise ApiError(400, "this server's engine serves no LoRA adapters", type="lora_unsupported")
    return engine


async def _call(action, *args) -> None:
    try:
        await action(*args)
    except AdapterNotFound as error:
        raise ApiError(404, str(error), loc=("body", "lora_name"), type="lora_not_found") from error
    except AdapterInUse as error:
        raise ApiError(409, str(error), loc=("body", "lora_name"), type="lora_in_use") from error
    except AdapterError as error:
        raise ApiError(400, str(error), type="invalid_lora_adapter") from error


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse, responses=RESPONSES)
async def load_lora_adapter(body: LoadLoraAdapterBody, request: Request):
    state = state_of(request)
    engine = _adapter_engine(state)
    if body.lora_name == state.model_name:
        raise ApiError(400, f"{body.lora_name!r} is the base model's name; choose another route",
                       loc=("body", "lora_name"), type="invalid_lora_adapter")
    await _call(engine.load_lora_adapter, body.lora_name, body.lora_path)
    return f"Success: LoRA adapter '{body.lora_name}' added successfully."


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse, responses=RESPONSES)
async def unload_lora_adapter(body: UnloadLoraAdapterBody, request: Request):
    engine = _adapter_engine(state_of(request))
    await _call(engine.unload_lora_adapter, body.lora_name)
    return f"Success: LoRA adapter '{body.lora_name}' removed successfully."
