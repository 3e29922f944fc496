"""The image service: requests in, batched pipeline runs on a thread of their own.

Requests that agree on what a pipeline call needs (`ImageJob.batch_key`: pipeline,
size, steps, guidance, strength, ControlNet weight) run as one call. The first waiting
request opens a batch; the service waits up to `batch_wait_s` for more compatible ones
(not past `max_batch_size`, `--max-num-seqs`), then runs it. Each request brings its
own `torch.Generator`, so its image does not depend on its batch (with
batch_invariance.py, the same bytes). A request whose client left is dropped from the
queue at once; in a running batch, the step callback stops the run at the next
denoising step once every request of the batch has left.
"""

import asyncio
import logging
import threading
import time
from dataclasses import dataclass

import torch

from amity.images.batch_invariance import invariant_kernels
from amity.images.job import ImageJob
from amity.images.pipelines import ImagePipelines

log = logging.getLogger("amity.images")


class ServiceStopped(Exception):
    """The service shut down before the request ran."""


@dataclass
class ImageStats:
    images_generated: int = 0
    image_steps: int = 0                 # denoising steps, counted per image
    steps_per_second: float = 0.0        # image steps per second of the last batch
    batches: int = 0
    running: int = 0                     # images in the pipeline run now


class ImageService:
    def __init__(self, pipelines: ImagePipelines, max_batch_size: int = 8,
                 batch_wait_s: float = 0.02):
        self.pipelines = pipelines
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.stats = ImageStats()
        self._waiting: list[tuple[ImageJob, asyncio.Future]] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="amity-images", daemon=True)

    @property
    def model_name(self) -> str:
        return self.pipelines.name

    def start(self) -> None:
        if not self._thread.is_alive():
            self._thread.start()

    def is_healthy(self) -> bool:
        return self._thread.is_alive() and not self._stopping

    def shutdown(self, timeout_s: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            waiting, self._waiting = self._waiting, []
            self._cond.notify_all()
        for job, future in waiting:
            _settle(future, error=ServiceStopped("the server is shutting down"))
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    async def run(self, job: ImageJob):
        """The job's PIL image. Cancelling the awaiting task (its client left) drops
        the job: from the queue at once, from a running batch at the next step."""
        if self._stopping:
            raise ServiceStopped("the server is shutting down")
        future = asyncio.get_running_loop().create_future()
        with self._cond:
            self._waiting.append((job, future))
            self._cond.notify()
        try:
            return await future
        except asyncio.CancelledError:
            job.cancelled = True
            with self._cond:
                self._waiting = [(j, f) for j, f in self._waiting if j is not job]
            raise

    def _next_batch(self) -> list[tuple[ImageJob, asyncio.Future]] | None:
        with self._cond:
            while not self._waiting and not self._stopping:
                self._cond.wait()
            if self._stopping:
                return None
            key = self._waiting[0][0].batch_key()
            deadline = time.monotonic() + self.batch_wait_s
            while True:
                batch = [(j, f) for j, f in self._waiting if j.batch_key() == key]
                batch = batch[: self.max_batch_size]
                left_s = deadline - time.monotonic()
                if len(batch) >= self.max_batch_size or left_s <= 0 or self._stopping:
                    break
                self._cond.wait(left_s)
            taken = {id(j) for j, _ in batch}
            self._waiting = [(j, f) for j, f in self._waiting if id(j) not in taken]
            return batch

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            batch = [(j, f) for j, f in batch if not j.cancelled]
            if not batch:
                continue
            try:
                images = self._run_batch([j for j, _ in batch])
            except Exception as err:  # noqa: BLE001 - the batch's requests get the error
                log.exception("an image batch of %d failed", len(batch))
                for _, future in batch:
                    _settle(future, error=err)
                continue
            for (job, future), image in zip(batch, images):
                if not job.cancelled:
                    _settle(future, result=image)

    def _run_batch(self, jobs: list[ImageJob]) -> list:
        started = time.perf_counter()
        for job in jobs:
            job.queued_s = started - job.arrived_s
        first = jobs[0]
        pipe, kwargs = self._call(first, jobs)
        steps_done = 0

        def on_step_end(pipeline, step, timestep, tensors):
            nonlocal steps_done
            steps_done += 1
            if all(j.cancelled for j in jobs):
                pipeline._interrupt = True  # diffusers skips the remaining steps
            return {}

        self.stats.running = len(jobs)
        try:
            with torch.inference_mode(), invariant_kernels(self.pipelines.batch_invariant):
                images = pipe(**kwargs, callback_on_step_end=on_step_end,
                              output_type="pil").images
        finally:
            self.stats.running = 0
        elapsed = time.perf_counter() - started
        live = sum(not j.cancelled for j in jobs)
        self.stats.batches += 1
        self.stats.images_generated += live
        self.stats.image_steps += steps_done * len(jobs)
        self.stats.steps_per_second = steps_done * len(jobs) / elapsed if elapsed else 0.0
        return images

    def _call(self, first: ImageJob, jobs: list[ImageJob]):
        """The pipeline and the keyword arguments of one batch."""
        p = self.pipelines
        device = (p.text_to_image or p.inpainting).device
        kwargs = dict(
            prompt=[j.prompt for j in jobs],
            num_inference_steps=first.num_inference_steps,
            guidance_scale=first.guidance_scale,
            generator=[torch.Generator(device).manual_seed(j.seed) for j in jobs],
            width=first.width, height=first.height)
        if first.kind == "generate":
            if first.control_image is not None:
                kwargs.update(image=[j.control_image for j in jobs],
                              controlnet_conditioning_scale=first.controlnet_weight)
            return p.text_to_image, kwargs
        kwargs.update(image=[j.image for j in jobs], strength=first.strength)
        if first.kind == "inpaint":
            return p.inpainting, dict(kwargs, mask_image=[j.mask for j in jobs])
        # diffusers' image-to-image takes its size from the image itself.
        del kwargs["width"], kwargs["height"]
        return p.image_to_image, kwargs


def _settle(future: asyncio.Future, result=None, error: BaseException | None = None) -> None:
    """Resolve `future` from any thread (the first outcome wins)."""
    def apply():
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    try:
        future.get_loop().call_soon_threadsafe(apply)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass
