"""Images per second: `amity serve` on a diffusers directory at concurrency 1 and 4
against a plain diffusers loop serving one request at a time, in one run.

    .venv/bin/python benchmarks/images.py                      # the tiny test pipeline
    .venv/bin/python benchmarks/images.py --model DIFFUSERS_DIR --steps 20

Without `--model` it builds the tiny random-weight Stable Diffusion pipeline the tests
use (tests/images/tiny_pipeline.py). The plain loop runs first, in this process, with
the server started but idle: per request it seeds a generator, calls the text-to-image
pipeline once and encodes the JPEG the server would send. At concurrency c, c clients
each send their next request when their last one ends (distinct seeds), `--requests`
per level after one warm-up request. Besides images per second of wall time it reports
images per CPU second (the plain loop's process; the server's process), which a
machine shared with other work disturbs less. Writes benchmarks/results/images.json.
"""

import argparse
import io
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from served import REPO, cpu_seconds, start_server, stop_server

sys.path.insert(0, str(REPO))




def plain_loop(model_dir: str, requests: int, steps: int, guidance: float) -> tuple[float, float]:
    """(images/s, images per CPU second) of the plain loop."""
    from diffusers import AutoPipelineForText2Image

    pipe = AutoPipelineForText2Image.from_pretrained(model_dir)
    pipe.set_progress_bar_config(disable=True)

    def one(seed: int) -> None:
        image = pipe(prompt=f"a red fox, take {seed}", num_inference_steps=steps,
                     guidance_scale=guidance, output_type="pil",
                     generator=torch.Generator().manual_seed(seed)).images[0]
        image.save(io.BytesIO(), format="JPEG", quality=95)

    one(0)  # warm-up
    started, cpu = time.perf_counter(), time.process_time()
    for seed in range(1, requests + 1):
        one(seed)
    return requests / (time.perf_counter() - started), requests / (time.process_time() - cpu)


def _metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def served_level(url: str, pid: int, concurrency: int, requests: int, steps: int,
                 guidance: float) -> tuple[float, float, float]:
    """(images/s, images per server CPU second, mean images per pipeline run) of one
    concurrency level."""
    with httpx.Client(base_url=url, timeout=600) as client:
        def one(seed: int) -> None:
            res = client.post("/v1/images/generations", json={
                "prompt": f"a red fox, take {seed}", "num_inference_steps": steps,
                "guidance_scale": guidance, "seed": seed})
            res.raise_for_status()

        one(0)  # warm-up
        batches = _metric(client, "amity_image_batches_total")
        started, cpu = time.perf_counter(), cpu_seconds(pid)
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, range(1, requests + 1)))
        rate = requests / (time.perf_counter() - started)
        per_cpu_s = requests / (cpu_seconds(pid) - cpu)
        return rate, per_cpu_s, requests / (_metric(client, "amity_image_batches_total") - batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a diffusers directory (default: the tiny pipeline)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--guidance-scale", type=float, default=0.0)
    parser.add_argument("--requests", type=int, default=16, help="per level")
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--image-batch-wait-ms", default="20", help="passed to amity serve")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = args.model
    if model_dir is None:
        from tests.images.tiny_pipeline import build_text_to_image

        model_dir = str(build_text_to_image(Path(tempfile.mkdtemp()) / "tiny-sd"))
    levels = [int(c) for c in args.concurrency.split(",")]
    results = {"model": model_dir, "steps": args.steps, "guidance_scale": args.guidance_scale,
               "requests_per_level": args.requests}
    results["plain_loop_images_per_s"], results["plain_loop_images_per_cpu_s"] = plain_loop(
        model_dir, args.requests, args.steps, args.guidance_scale)
    proc, url = start_server(["--model", model_dir, "--max-num-seqs", str(max(levels)),
                              "--image-batch-wait-ms", args.image_batch_wait_ms],
                             out / "images_server.log")
    try:
        for c in levels:
            rate, per_cpu_s, batch = served_level(url, proc.pid, c, args.requests, args.steps,
                                                  args.guidance_scale)
            results[f"amity_c{c}_images_per_s"] = rate
            results[f"amity_c{c}_images_per_cpu_s"] = per_cpu_s
            results[f"amity_c{c}_mean_batch"] = batch
    finally:
        stop_server(proc)
    base, base_cpu = results["plain_loop_images_per_s"], results["plain_loop_images_per_cpu_s"]
    print("| system | images/s | vs plain loop | images per CPU s | vs plain loop | "
          "images per pipeline run |\n|---|---|---|---|---|---|\n"
          f"| plain diffusers loop | {base:.2f} | 1.00x | {base_cpu:.2f} | 1.00x | 1 |")
    for c in levels:
        rate, per_cpu_s = results[f"amity_c{c}_images_per_s"], results[f"amity_c{c}_images_per_cpu_s"]
        print(f"| amity, concurrency {c} | {rate:.2f} | {rate / base:.2f}x | {per_cpu_s:.2f} | "
              f"{per_cpu_s / base_cpu:.2f}x | {results[f'amity_c{c}_mean_batch']:.2f} |")
    (out / "images.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
