"""How fast this machine reads memory: the roof of a one-stream decode step.

A one-stream step reads every weight once, and nothing else it does is as large, so
a model's weight bytes over this read rate bound its tokens/s from above. torch's
float32 sum over a buffer of that size, on the threads a server uses, medians of
`--repeats` reads; run it beside a side-by-side benchmark (before and after) to
know the roof of the minutes it ran in (the rate here moves by a third between
minutes).

    .venv/bin/python benchmarks/memory_roof.py --megabytes 271   # the bfloat16 SmolLM2-135M's weights
"""

import argparse
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=271.0, help="bytes read per pass (a model's weights)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=8, help="reads per measurement")
    parser.add_argument("--measurements", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    buffer = torch.ones(int(args.megabytes * 1e6) // 4, dtype=torch.float32)
    buffer.sum()  # pages faulted in
    for _ in range(args.measurements):
        times_s = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            buffer.sum()
            times_s.append(time.perf_counter() - start)
        pass_s = statistics.median(times_s)
        print(f"{time.strftime('%H:%M:%S')} {args.megabytes / pass_s / 1e3:.1f} GB/s: {pass_s * 1e3:.2f} ms a pass, "
              f"at most {1 / pass_s:.1f} passes (tokens) a second", flush=True)


if __name__ == "__main__":
    main()
