"""Image generation and edits on diffusers pipelines: loading (`pipelines`), request
batching on a thread of its own (`service`), image inputs (`inputs`) and outputs
(`codec`). Speaks plain dataclasses; the HTTP side lives in `amity/server/routes/images.py`."""
