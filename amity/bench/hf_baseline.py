"""The naive baseline for `amity bench compare`: `transformers` `generate` behind a tiny
streaming `/v1/completions`, one request at a time (what a user gets by wrapping the
library in a web server without a batching engine; later requests wait their turn, and
that wait counts in their TTFT).

    python -m amity.bench.hf_baseline --port 8100 [--model PATH.gguf|HF_DIR] [--threads N]

Greedy only. `min_tokens` (or `ignore_eos`) pins the output length through
`min_new_tokens`, so the load generator's count checks hold as they do for amity.
"""

import argparse
import asyncio
import json
import threading
import time
from pathlib import Path

import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer


class _ToQueue(BaseStreamer):
    """Hands each new token id to the event loop as `generate` produces it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
        self.loop, self.queue, self.prompt_seen = loop, queue, False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:  # generate's first put is the prompt itself
            self.prompt_seen = True
            return
        for token in value.reshape(-1).tolist():
            self.loop.call_soon_threadsafe(self.queue.put_nowait, token)

    def end(self) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, None)


class _Cancelled(StoppingCriteria):
    def __init__(self, event: threading.Event):
        self.event = event

    def __call__(self, input_ids, scores, **kwargs) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool)


class Baseline:
    def __init__(self, model_path: Path, dtype: torch.dtype, name: str):
        where = {"gguf_file": model_path.name} if model_path.is_file() else {}
        directory = str(model_path.parent if model_path.is_file() else model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(directory, **where)
        self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, **where).eval()
        self.name = name
        self.turn = asyncio.Lock()  # one generate at a time: the point of this baseline
        self._generate(self.tokenizer.encode("warm up"), 2, 2, None, threading.Event())

    def _generate(self, ids, max_new, min_new, streamer, cancel) -> torch.Tensor:
        with torch.inference_mode():
            return self.model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_new, min_new_tokens=min_new, do_sample=False,
                streamer=streamer, stopping_criteria=StoppingCriteriaList([_Cancelled(cancel)]),
                pad_token_id=self.tokenizer.eos_token_id)

    async def tokens(self, ids: list[int], max_new: int, min_new: int):
        """Yield token ids as they are generated; stop generating if the caller leaves."""
        async with self.turn:
            loop, queue, cancel = asyncio.get_running_loop(), asyncio.Queue(), threading.Event()
            worker = threading.Thread(target=self._generate, daemon=True,
                                      args=(ids, max_new, min_new, _ToQueue(loop, queue), cancel))
            worker.start()
            try:
                while (token := await queue.get()) is not None:
                    yield token
            finally:
                cancel.set()
                await asyncio.to_thread(worker.join)

    # ---------------------------------------------------------------- HTTP

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/health", lambda r: JSONResponse({"status": "ok"})),
            Route("/v1/models", lambda r: JSONResponse(
                {"object": "list", "data": [{"id": self.name, "object": "model"}]})),
            Route("/v1/tokenize", self.tokenize, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
        ])

    async def tokenize(self, request: Request):
        body = await request.json()
        return JSONResponse({"tokens": self.tokenizer.encode(body["prompt"])})

    async def completions(self, request: Request):
        body = await request.json()
        ids = body.get("tokens") or self.tokenizer.encode(body.get("prompt") or "")
        max_new = body.get("max_tokens") or 16
        min_new = max_new if body.get("ignore_eos") else min(body.get("min_tokens") or 0, max_new)
        if not body.get("stream"):
            out = [t async for t in self.tokens(ids, max_new, min_new)]
            return JSONResponse({
                "id": "cmpl-hf", "object": "text_completion", "model": self.name,
                "choices": [{"index": 0, "text": self.tokenizer.decode(out), "tokens": out,
                             "finish_reason": "length" if len(out) == max_new else "stop"}],
                "usage": self._usage(len(ids), len(out))})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return StreamingResponse(self._stream(ids, max_new, min_new, include_usage),
                                 media_type="text/event-stream")

    async def _stream(self, ids, max_new, min_new, include_usage):
        created, out, shown = int(time.time()), [], ""
        frame = lambda choices, **extra: ("data: " + json.dumps({  # noqa: E731
            "id": "cmpl-hf", "object": "text_completion", "created": created,
            "model": self.name, "choices": choices, **extra}) + "\n\n").encode()
        async for token in self.tokens(ids, max_new, min_new):
            out.append(token)
            text = self.tokenizer.decode(out, skip_special_tokens=True)
            new = "" if text.endswith("\ufffd") else text[len(shown):]  # hold a split character
            shown += new
            yield frame([{"index": 0, "text": new, "token": token, "finish_reason": None}])
        reason = "length" if len(out) == max_new else "stop"
        yield frame([{"index": 0, "text": "", "finish_reason": reason}])
        if include_usage:
            yield frame([], usage=self._usage(len(ids), len(out)))
        yield b"data: [DONE]\n\n"

    @staticmethod
    def _usage(prompt: int, completion: int) -> dict:
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m amity.bench.hf_baseline", description=__doc__)
    parser.add_argument("--model", default=None, help="GGUF file or HF directory. Default: amity's.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32", "float16"))
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model is None:
        from amity.models.loader import default_model_path

        args.model = str(default_model_path())
    path = Path(args.model)
    baseline = Baseline(path, getattr(torch, args.dtype), path.stem)
    # asyncio's loop named: uvicorn's "auto" would take uvloop (installed for the Suite).
    uvicorn.run(baseline.app(), host=args.host, port=args.port, log_level="warning", loop="asyncio")


if __name__ == "__main__":
    main()
