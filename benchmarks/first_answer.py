"""Time to the first answered request of `amity serve` as it ships, cold and warm.

Starts `amity serve --port P [ARGS]` and, from the moment it is spawned, sends a short
greedy completion every 0.2 s until one is answered (200); then polls /metrics until
`amity_compile_state` is 2 (compiled) or 3 (failed). Each run uses TORCHINDUCTOR_CACHE_DIR
= --cache-dir: the first run on an empty directory is the cold start (a machine that never
compiled the model), the next ones warm starts. Prints one JSON line a run.

    .venv/bin/python benchmarks/first_answer.py --cache-dir $(mktemp -d) --runs 2
    .venv/bin/python benchmarks/first_answer.py --cache-dir DIR --runs 1 -- --compile true
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

import httpx

from served import free_port

STATE = re.compile(r"^amity_compile_state (\S+)$", re.MULTILINE)




def one_run(cache_dir: str, extra: list[str], timeout_s: float) -> dict:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache_dir}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "amity.cli", "serve", "--port", str(port), *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result: dict = {"args": extra}
    try:
        body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
        while "first_answer_s" not in result:
            if time.monotonic() - started > timeout_s or proc.poll() is not None:
                raise RuntimeError(f"no answer (exit code {proc.poll()})")
            try:
                if httpx.post(f"{url}/v1/completions", json=body, timeout=600).status_code == 200:
                    result["first_answer_s"] = round(time.monotonic() - started, 1)
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        while "compile_state" not in result:
            state = int(float(STATE.search(httpx.get(f"{url}/metrics", timeout=60).text).group(1)))
            if state in (0, 2, 3):
                result["compile_state"] = state
                result["compiled_s"] = round(time.monotonic() - started, 1)
            elif time.monotonic() - started > timeout_s:
                raise RuntimeError("still compiling")
            time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    result["load_avg"] = [round(x, 1) for x in os.getloadavg()]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-dir", required=True, help="TORCHINDUCTOR_CACHE_DIR of every run")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=1800)
    parser.add_argument("serve_args", nargs="*", help="after --: extra `amity serve` flags")
    args = parser.parse_args()
    for i in range(args.runs):
        cold = not os.listdir(args.cache_dir) if os.path.isdir(args.cache_dir) else True
        print(json.dumps({"run": i, "cold": cold, **one_run(args.cache_dir, args.serve_args, args.timeout_s)}),
              flush=True)


if __name__ == "__main__":
    main()
