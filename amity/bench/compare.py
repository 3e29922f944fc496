"""`amity bench compare`: amity and each installed peer, one after another, on one workload.

Each system runs alone on the machine (started, loaded, stopped before the next starts),
with the same model file where it can read it, the same thread count and the same
`amity bench serve` load, so the ratios compare servers, not setups. A peer that is not
installed is listed as skipped; one that fails to start is listed with its log.

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
import subprocess
import sys
import time
from dataclasses import dataclass, field
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
    for spec in args.peer:
        name, sep, url = spec.partition("=")
        if not sep or not url:
            raise ValueError(f"--peer wants NAME=URL, got {spec!r}")
        systems.append(System(name, url=url.rstrip("/")))
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


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "–"


def _ms(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def compare_table(results: dict[str, list[dict] | str]) -> str:
    """One row per system and level; ratios say how many times amity is ahead."""
    amity = {s["concurrency"]: s for s in results.get("amity") or [] if isinstance(s, dict)}
    lines = ["| system | concurrency | out tok/s | amity tok/s ÷ this | TTFT p50 ms "
             "| this TTFT ÷ amity's | ITL p50 ms | E2E p50 ms | failures |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, summaries in results.items():
        if isinstance(summaries, str):
            lines.append(f"| {name} | – | {summaries} | | | | | | |")
            continue
        for s in summaries:
            a = amity.get(s["concurrency"])
            lines.append(
                f"| {name} | {serve.level_label(s)} | {s['output_tok_s']:.1f} "
                f"| {_ratio(a and a['output_tok_s'], s['output_tok_s'])} "
                f"| {_ms(s['ttft_ms']['p50'])} "
                f"| {_ratio(s['ttft_ms']['p50'], a and a['ttft_ms']['p50'])} "
                f"| {_ms(s['itl_ms']['p50'], 1)} | {_ms(s['e2e_ms']['p50'])} "
                f"| {s['failures']} / {s['num_prompts']} |")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    workload = serve.workload_from_args(args)
    out = Path(args.out or time.strftime("benchmarks/results/compare-%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict] | str] = {}
    for system in plan(args, workload):
        if system.skipped:
            results[system.name] = system.skipped
            print(f"{system.name}: {system.skipped}", file=sys.stderr)
            continue
        running = None
        try:
            if system.argv:
                print(f"{system.name}: starting {shlex.join(system.argv)}", file=sys.stderr)
                running = Running(system, out / f"{system.name}.log")
                running.wait_ready()
            summaries, records = asyncio.run(serve.run_benchmark(
                system.url, workload, system.name, progress=not args.no_progress))
            print(serve.write_results(out / system.name, summaries, records))
            results[system.name] = summaries
        except Exception as error:  # noqa: BLE001 - one broken peer must not sink the others
            detail = f" (log: {running.log_path})" if running else ""
            results[system.name] = f"failed: {error}"[:200] + detail
            print(f"{system.name}: failed: {error}{detail}", file=sys.stderr)
            if running:
                print(running.log_tail(), file=sys.stderr)
        finally:
            if running:
                running.stop()

    table = compare_table(results)
    (out / "compare.md").write_text(table)
    with open(out / "compare.jsonl", "w") as f:
        for name, summaries in results.items():
            rows = summaries if isinstance(summaries, list) else [{"system": name,
                                                                   "status": summaries}]
            f.writelines(json.dumps(r) + "\n" for r in rows)
    ran = {n: s for n, s in results.items() if isinstance(s, list)}
    if ran:
        serve.plot(ran, out / "compare.png")
    print(table)
    failures = serve.failure_report([s for ss in ran.values() for s in ss])
    if failures:
        print(failures, file=sys.stderr)
    print(f"results in {out}/ (compare.md, compare.jsonl, compare.png, one folder per system)",
          file=sys.stderr)
    broken = any(isinstance(v, str) and v.startswith("failed") for v in results.values())
    return 1 if failures or broken else 0
