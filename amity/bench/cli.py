"""The `amity bench serve` and `amity bench compare` subcommands.

Heavy imports (httpx, matplotlib, numpy) wait until a subcommand runs, so `amity --help`
and `amity serve` start as fast as before.
"""

import argparse
import sys


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be integers >= 1")
    return values


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--concurrency", type=_int_list, default=None,
                        help="Comma-separated levels, each run in turn. Default: 1,8,32; with "
                             "--request-rate, one uncapped level (given levels cap in-flight requests).")
    parser.add_argument("--request-rate", type=float, default=None,
                        help="Poisson arrivals at this many requests/s instead of a closed loop.")
    parser.add_argument("--num-prompts", type=int, default=None,
                        help="Requests per level. Default: max(8, 4 x concurrency).")
    parser.add_argument("--input-len", type=int, default=128, help="Prompt tokens per request.")
    parser.add_argument("--output-len", type=int, default=128,
                        help="Output tokens per request (min_tokens = max_tokens).")
    parser.add_argument("--seed", type=int, default=0, help="Seeds the prompts and the arrivals.")
    parser.add_argument("--model", default=None,
                        help="`model` to send. Default: the first of the server's /v1/models.")
    parser.add_argument("--out", default=None,
                        help="Results folder. Default: benchmarks/results/<command>-<time>.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")


def _serve(args: argparse.Namespace) -> None:
    from amity.bench import serve

    sys.exit(serve.main(args))


def _compare(args: argparse.Namespace) -> None:
    from amity.bench import compare

    sys.exit(compare.main(args))


def add_bench_parser(subparsers) -> None:
    bench = subparsers.add_parser("bench", help="measure a serving API (TTFT, ITL, throughput)")
    commands = bench.add_subparsers(dest="bench_command", required=True)

    srv = commands.add_parser("serve", help="load a running server and report its figures")
    srv.add_argument("--url", required=True, help="Base URL, e.g. http://127.0.0.1:8000")
    srv.add_argument("--system", default="server", help="Name for this server in the results.")
    add_workload_arguments(srv)
    srv.set_defaults(func=_serve)

    cmp = commands.add_parser("compare", help="start amity and each installed peer, load them in "
                                              "turn (A, B, A, B ...) for --rounds rounds, print the "
                                              "medians and ratios")
    cmp.add_argument("--rounds", type=int, default=3,
                     help="Rounds; every system is loaded once a round, in turn (at least 3).")
    cmp.add_argument("--peer", action="append", default=[], metavar="NAME=URL",
                     help="Also load this already-running server (repeatable).")
    cmp.add_argument("--command", action="append", default=[], metavar="NAME=COMMAND",
                     help="Also start this server command, its port written {port} (repeatable).")
    cmp.add_argument("--reference", default=None,
                     help="System the ratios are taken against. Default: amity if it runs, else the first.")
    cmp.add_argument("--systems", default="amity,llama.cpp,vllm,transformers",
                     help="Which of the systems to start, comma-separated.")
    cmp.add_argument("--threads", type=int, default=None,
                     help="CPU threads for every system. Default: all cores.")
    cmp.add_argument("--gguf", default=None,
                     help="Model for amity, llama.cpp and transformers. Default: amity's default GGUF.")
    cmp.add_argument("--amity-args", default="", help="Extra `amity serve` flags, one string.")
    cmp.add_argument("--llama-parallel", type=int, default=None,
                     help="llama-server --parallel slots. Default: the highest concurrency level.")
    cmp.add_argument("--vllm-python", default=None,
                     help="Python of the venv vLLM is installed in. Default: this one.")
    cmp.add_argument("--vllm-model", default=None,
                     help="Model for vLLM (a HF directory, or a GGUF it can read). Default: --gguf.")
    cmp.add_argument("--hf-dtype", default="bfloat16",
                     help="dtype of the transformers baseline.")
    add_workload_arguments(cmp)
    cmp.set_defaults(func=_compare)
