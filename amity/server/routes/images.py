"""POST /v1/images/generations and /v1/images/edits on the image service.

Image inputs are resolved before the request queues (URLs fetched under the fetch
policy, bytes decoded off the event loop), so a bad input is a 422 that never holds a
batch slot. Edits: one image runs image-to-image; an image and a mask (`image` as a
list of two: the image, then the mask, white where to paint) run inpainting. The output
size is `width` x `height` if given, else the input image's (edits; scaled down to fit
the model's default side) or the model's default (generations), rounded down to what
the model accepts.
"""

import secrets

from fastapi import APIRouter, Request

from amity.images import codec
from amity.images.inputs import image_bytes
from amity.images.job import ImageJob
from amity.images.service import ImageService, ServiceStopped
from amity.server import image_schemas as s
from amity.server.errors import ApiError, EngineUnavailable, error_responses
from amity.server.generation import run_unless_disconnected
from amity.server.state import ServerState, state_of

router = APIRouter()

IMG2IMG_STRENGTH = 0.8   # diffusers' defaults
INPAINT_STRENGTH = 1.0


@router.post("/v1/images/generations", response_model=s.ImageGenerationContainerResult,
             responses=error_responses())
async def generations(body: s.ContainerImageGenerationBody, request: Request):
    state = state_of(request)
    service = state.resolve_images(body.model)
    pipes = service.pipelines
    if pipes.text_to_image is None:
        raise ApiError(400, f"{state.model_name!r} is an inpainting model: send an image and "
                            "a mask to /v1/images/edits", type="unsupported_task")
    control, weight = None, 1.0
    if body.control_images is not None or body.controlnet_weights is not None:
        control, weight = await _control(state, body, pipes.has_controlnet)
    width, height = _size(body, pipes, pipes.default_width, pipes.default_height)
    job = ImageJob("generate", body.prompt, _seed(body), body.num_inference_steps,
                   body.guidance_scale, width, height, control_image=control,
                   controlnet_weight=weight)
    return await _run(request, state, service, job, body.response_format)


@router.post("/v1/images/edits", response_model=s.ImageGenerationContainerResult,
             responses=error_responses())
async def edits(body: s.ContainerImageEditBody, request: Request):
    state = state_of(request)
    service = state.resolve_images(body.model)
    pipes = service.pipelines
    inputs = body.image if isinstance(body.image, list) else [body.image]
    if len(inputs) not in (1, 2):
        raise ApiError(422, f"`image` takes one image, or an image and its mask (got "
                            f"{len(inputs)})", loc=("body", "image"))
    if len(inputs) == 1 and pipes.image_to_image is None:
        raise ApiError(422, f"{state.model_name!r} is an inpainting model: send `image` as "
                            "[image, mask]", loc=("body", "image"))
    if len(inputs) == 2 and pipes.inpainting is None:
        raise ApiError(422, f"{state.model_name!r} has no inpainting pipeline: send one image",
                       loc=("body", "image"))
    loc = ("body", "image") if not isinstance(body.image, list) else None
    images = [await _decode(state, item, loc or ("body", "image", i))
              for i, item in enumerate(inputs)]
    width, height = _size(body, pipes, *_within(images[0].size, pipes))
    resized = await state.off_loop(_resize, images, width, height)
    image, mask = resized[0], resized[1].convert("L") if len(resized) == 2 else None
    kind = "inpaint" if len(images) == 2 else "edit"
    steps = body.num_inference_steps
    strength = body.strength or (INPAINT_STRENGTH if kind == "inpaint" else IMG2IMG_STRENGTH)
    # diffusers runs int(steps * strength) steps and refuses zero: at least one.
    strength = max(strength, 1.0 / steps)
    job = ImageJob(kind, body.prompt, _seed(body), steps, body.guidance_scale, width, height,
                   strength=strength, image=image, mask=mask)
    return await _run(request, state, service, job, body.response_format)


def _seed(body) -> int:
    return body.seed if body.seed is not None else secrets.randbelow(2**63)


def _within(size: tuple[int, int], pipes) -> tuple[int, int]:
    """An input image's size, scaled down (aspect kept) to fit the model's default side:
    a 50 MiB photo must not become a pipeline run at its full size unasked."""
    side = max(pipes.default_width, pipes.default_height)
    scale = min(1.0, side / max(size))
    return round(size[0] * scale), round(size[1] * scale)


def _resize(images: list, width: int, height: int) -> list:
    return [im if im.size == (width, height) else im.resize((width, height)) for im in images]


def _size(body, pipes, default_width: int, default_height: int) -> tuple[int, int]:
    """The output size: asked for, else the default, rounded down to a multiple the
    model accepts (a requested size must already be one)."""
    multiple = pipes.size_multiple
    for name in ("width", "height"):
        value = getattr(body, name)
        if value is not None and value % multiple:
            raise ApiError(422, f"`{name}` must be a multiple of {multiple} for this model",
                           loc=("body", name))
    width = body.width or max(multiple, default_width // multiple * multiple)
    height = body.height or max(multiple, default_height // multiple * multiple)
    return width, height


async def _decode(state: ServerState, item: s.ImageInput, loc: tuple):
    try:
        data = await image_bytes(item.image, state.image_fetch, loc)
        return await state.off_loop(codec.decode, data, loc)
    except codec.BadImage as err:
        raise ApiError(422, err.msg, loc=err.loc, type="invalid_image") from None


async def _control(state: ServerState, body: s.ContainerImageGenerationBody, has_controlnet: bool):
    if not has_controlnet:
        raise ApiError(422, f"{state.model_name!r} has no ControlNet: leave out "
                            "`control_images` and `controlnet_weights`",
                       loc=("body", "control_images"))
    images = body.control_images or []
    if len(images) != 1:
        raise ApiError(422, f"this model has one ControlNet, so `control_images` takes one "
                            f"image (got {len(images)})", loc=("body", "control_images"))
    weights = body.controlnet_weights if body.controlnet_weights is not None else [1.0]
    if len(weights) != len(images):
        raise ApiError(422, f"`controlnet_weights` has {len(weights)} values for "
                            f"{len(images)} control images; give one per image",
                       loc=("body", "controlnet_weights"))
    return await _decode(state, images[0], ("body", "control_images", 0)), weights[0]


async def _run(request: Request, state: ServerState, service: ImageService, job: ImageJob,
               response_format: str | None):
    tracker = state.admit(1)
    tracker.submitted()
    try:
        image = await run_unless_disconnected(request, service.run(job))
    except ServiceStopped as err:
        tracker.errored()
        raise EngineUnavailable(str(err)) from None
    except BaseException:
        if job.cancelled:
            tracker.cancelled()
        else:
            tracker.errored()
        raise
    tracker.scheduled(job.queued_s or 0.0)
    encoded = await state.off_loop(codec.encode, image, response_format or "jpeg")
    tracker.completed()
    return s.ImageGenerationContainerResult(image=encoded, seed=job.seed)
