"""One image to make: what the service needs of a request, in plain fields."""

import time
from dataclasses import dataclass, field

from PIL import Image


@dataclass
class ImageJob:
    kind: str                  # "generate", "edit" (image-to-image) or "inpaint"
    prompt: str
    seed: int
    num_inference_steps: int
    guidance_scale: float
    width: int
    height: int
    strength: float | None = None         # edits: how much of the image is re-noised
    image: Image.Image | None = None      # edits: the image, already width x height
    mask: Image.Image | None = None       # inpaint: white where to paint
    control_image: Image.Image | None = None
    controlnet_weight: float = 1.0
    arrived_s: float = field(default_factory=time.perf_counter)
    queued_s: float | None = None         # set when its batch starts
    # Set from the event loop when the client leaves; read by the service's thread
    # (a plain bool: one writer, and a late read costs one step at most).
    cancelled: bool = False

    def batch_key(self) -> tuple:
        """Jobs with equal keys can run as one pipeline call."""
        return (self.kind, self.width, self.height, self.num_inference_steps,
                self.guidance_scale, self.strength, self.control_image is not None,
                self.controlnet_weight)
