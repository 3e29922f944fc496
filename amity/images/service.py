"""The image service: requests in, batched pipeline runs on a thread of their own.

Requests that agree on what a pipeline call needs (`ImageJob.batch_key`: pipeline,
size, steps, guidance, strength, ControlNet weight) run as one call. The first waiting
request opens a batch; the service waits up to `batch_wait_s` for more compatible ones
(not past `max_batch_size`, `--max-num-seqs`), then runs it. Each request brings its
own `torch.Generator`, so its image does not depend on its batch (with
batch_invariance.py, the same bytes). A request whose client left is dropped from the
queue at once; in a running batch, the step callback cuts its row out of the batch at
the next denoising step (where the pipeline's state allows: `rows_droppable`), and
stops the run once every request of the batch has left.
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
                if not job.cancelled and image is not None:
                    _settle(future, result=image)

    def _run_batch(self, jobs: list[ImageJob]) -> list:
        """The batch's images, in `jobs` order (None for a job dropped mid-run)."""
        started = time.perf_counter()
        for job in jobs:
            job.queued_s = started - job.arrived_s
        first = jobs[0]
        pipe, kwargs = self._call(first, jobs)
        rows = list(range(len(jobs)))  # the jobs still in the running tensors, in row order
        droppable = rows_droppable(pipe)
        image_steps = 0

        def on_step_end(pipeline, step, timestep, tensors):
            nonlocal image_steps
            image_steps += len(rows)
            live = [i for i, job in enumerate(rows) if not jobs[job].cancelled]
            if not live:
                pipeline._interrupt = True  # diffusers skips the remaining steps
                return {}
            if not droppable or len(live) == len(rows):
                return {}
            rows[:] = [rows[i] for i in live]
            return keep_rows(pipeline, tensors, live, kwargs["generator"])

        self.stats.running = len(jobs)
        try:
            with torch.inference_mode(), invariant_kernels(self.pipelines.batch_invariant):
                images = pipe(**kwargs, callback_on_step_end=on_step_end,
                              callback_on_step_end_tensor_inputs=list(CUT_TENSORS if droppable
                                                                      else ["latents"]),
                              output_type="pil").images
        finally:
            self.stats.running = 0
        elapsed = time.perf_counter() - started
        self.stats.batches += 1
        self.stats.images_generated += sum(not jobs[job].cancelled for job in rows)
        self.stats.image_steps += image_steps
        self.stats.steps_per_second = image_steps / elapsed if elapsed else 0.0
        by_job = dict(zip(rows, images))
        return [by_job.get(i) for i in range(len(jobs))]

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


# Pipelines whose batch-sized state, besides the scheduler's, is exactly these tensors
# (given to the step callback, which may return them cut), and schedulers that keep no
# batch-sized history between steps (their per-row noise comes from the generator list,
# which is cut in place). Elsewhere a departed request's row runs to the end.
CUT_TENSORS = ("latents", "prompt_embeds")
CUTTABLE_PIPELINES = {"StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline"}
HISTORY_FREE_SCHEDULERS = {"DDIMScheduler", "DDPMScheduler", "EulerDiscreteScheduler",
                           "EulerAncestralDiscreteScheduler", "LCMScheduler"}


def rows_droppable(pipe) -> bool:
    return (type(pipe).__name__ in CUTTABLE_PIPELINES
            and type(pipe.scheduler).__name__ in HISTORY_FREE_SCHEDULERS
            and pipe.unet.config.time_cond_proj_dim is None)  # else a batch-sized guidance embedding


def keep_rows(pipe, tensors: dict, live: list[int], generators: list) -> dict:
    """The callback's answer that cuts the batch down to rows `live`. With classifier-free
    guidance the prompt embeddings are [unconditional; conditional], two rows per image."""
    batch = tensors["latents"].shape[0]
    embed_rows = live + [batch + i for i in live] if pipe.do_classifier_free_guidance else live
    generators[:] = [generators[i] for i in live]  # the pipeline holds this very list
    return {"latents": tensors["latents"][live],
            "prompt_embeds": tensors["prompt_embeds"][embed_rows]}


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
