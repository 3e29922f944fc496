"""Loading a diffusers model directory into the pipelines the API needs.

The directory's own pipeline loads through diffusers' auto pipelines (text-to-image,
or inpainting when the directory is an inpainting model); image-to-image and
inpainting pipelines are derived from it with `from_pipe`, sharing its weights. A
ControlNet directory's edits run without the ControlNet (the edit body has no control
images). Whatever diffusers can load from a local directory (Stable Diffusion 1.x/2.x,
SDXL, SD3, Flux, ...) loads here; the tests run the Stable Diffusion family.
"""

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from amity.images.batch_invariance import make_batch_invariant

log = logging.getLogger("amity.images")


def is_diffusers_dir(path: str | None) -> bool:
    return path is not None and (Path(path) / "model_index.json").is_file()


@dataclass
class ImagePipelines:
    name: str
    text_to_image: object | None   # None for an inpainting model
    image_to_image: object | None
    inpainting: object | None
    has_controlnet: bool
    default_width: int
    default_height: int
    size_multiple: int             # width and height must be multiples of it
    batch_invariant: bool          # see batch_invariance.py

    @property
    def task(self) -> str:
        return "image inpainting" if self.text_to_image is None else "image generation"


def _derive(auto_cls, pipe, **kwargs):
    try:
        return auto_cls.from_pipe(pipe, **kwargs)
    except (ValueError, KeyError, TypeError) as err:  # no such pipeline for this family
        log.info("no %s for %s: %s", auto_cls.__name__, type(pipe).__name__, err)
        return None


def _resolve(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "bfloat16"
    return torch.device(device), getattr(torch, dtype)


def load_pipelines(model_dir: str, device: str = "auto", dtype: str = "auto") -> ImagePipelines:
    from diffusers import (AutoPipelineForImage2Image, AutoPipelineForInpainting,
                           AutoPipelineForText2Image)

    torch_device, torch_dtype = _resolve(device, dtype)
    declared = json.loads((Path(model_dir) / "model_index.json").read_text())["_class_name"]
    inpainting_model = "Inpaint" in declared
    loader = AutoPipelineForInpainting if inpainting_model else AutoPipelineForText2Image
    # diffusers shows its own progress bar while the components load.
    pipe = loader.from_pretrained(model_dir, dtype=torch_dtype).to(torch_device)
    has_controlnet = "controlnet" in pipe.components
    text_to_image = None if inpainting_model else pipe
    without_controlnet = {"controlnet": None} if has_controlnet else {}
    image_to_image = None if inpainting_model else _derive(
        AutoPipelineForImage2Image, pipe, **without_controlnet)
    inpainting = pipe if inpainting_model else _derive(
        AutoPipelineForInpainting, pipe, **without_controlnet)
    batch_invariant = torch_device.type == "cpu"
    for p in {id(p): p for p in (text_to_image, image_to_image, inpainting) if p}.values():
        p.set_progress_bar_config(disable=True)
        if batch_invariant:
            make_batch_invariant(p)
    scale = getattr(pipe, "vae_scale_factor", 8)
    sample = getattr(pipe, "default_sample_size", None)
    if sample is None:
        denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
        sample = denoiser.config.sample_size
    side = sample * scale
    return ImagePipelines(
        name=Path(model_dir).resolve().name, text_to_image=text_to_image,
        image_to_image=image_to_image, inpainting=inpainting, has_controlnet=has_controlnet,
        default_width=side, default_height=side, size_multiple=max(8, scale),
        batch_invariant=batch_invariant)
