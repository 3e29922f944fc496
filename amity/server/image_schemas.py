"""Wire models of the container's image operations (`ContainerImageGenerationBody`,
`ContainerImageEditBody`, `ImageInput`, `ImageGenerationContainerResult`).

Ranges are checked here, where pydantic's 422 names the field: steps in [1, 50], each
ControlNet weight in [0, 1], a seed in [0, 2^64 - 1] (as the text routes). `width` and
`height` are amity's addition (the spec has no size: without them, the model's own
default size); `strength` likewise (edits: diffusers' default when absent).
"""

from typing import Annotated, Literal

from pydantic import Field

from amity.server.schemas import RequestModel, ResponseModel

Seed = Annotated[int, Field(ge=0, le=2**64 - 1)]
Side = Annotated[int, Field(ge=8, le=4096)]
Unit = Annotated[float, Field(ge=0.0, le=1.0)]


class ImageInput(RequestModel):
    image: str = Field(description="An http(s) URL, a data URI, or base64 image bytes; "
                                   "at most 50 MiB.")


class _ImageBody(RequestModel):
    prompt: str
    model: str | None = None
    num_inference_steps: Annotated[int, Field(ge=1, le=50)] = 20
    guidance_scale: float = 0.0
    seed: Seed | None = None
    response_format: Literal["raw", "jpeg"] | None = "jpeg"
    width: Side | None = Field(None, description="amity: output width in pixels.")
    height: Side | None = Field(None, description="amity: output height in pixels.")


class ContainerImageGenerationBody(_ImageBody):
    control_images: list[ImageInput] | None = None
    controlnet_weights: list[Unit] | None = None


class ContainerImageEditBody(_ImageBody):
    image: ImageInput | list[ImageInput]
    strength: Annotated[float, Field(gt=0.0, le=1.0)] | None = Field(
        None, description="amity: share of the image re-noised; default 0.8 (image-to-image), "
                          "1.0 (inpainting), diffusers' defaults.")


class ImageGenerationContainerResult(ResponseModel):
    image: str = Field(description="The base64-encoded image: JPEG, or PNG for `raw`.")
    seed: int = Field(description="amity: the seed the image was made with (drawn when "
                                  "the request had none).")
