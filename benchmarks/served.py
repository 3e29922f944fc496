"""Starting and stopping `amity serve` for the benchmark scripts that need their own
server process (prefix_cache_ttft.py, memory_flat.py): a free port, ready when /health
is 200, stopped with SIGTERM; and a process's CPU time, for the scripts that report it."""

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


SERVER_FLAGS = ("model", "dtype", "kv_cache_memory", "num_threads", "quantization", "compile")


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The `amity serve` flags a benchmark passes through; unset ones keep serve's default."""
    for name in SERVER_FLAGS:
        parser.add_argument("--" + name.replace("_", "-"), default=None,
                            help="passed to amity serve")


def server_flags(args: argparse.Namespace) -> list[str]:
    flags = []
    for name in SERVER_FLAGS:
        if getattr(args, name) is not None:
            flags += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return flags


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int, tid: int | None = None) -> float:
    """User + system CPU seconds of a process (all its threads) or of one of its threads
    so far (Linux /proc)."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat").read_text()
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(server_args: list[str], log_path: Path, timeout: float = 300):
    """`python -m amity.cli serve ARGS`, output to `log_path`; returns (process, url) once
    /health is 200 (it is 503 while the model loads)."""
    port = free_port()
    cmd = [sys.executable, "-m", "amity.cli", "serve", "--port", str(port), *server_args]
    log = open(log_path, "w")  # noqa: SIM115 - closed when the process is stopped
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    proc.log = log
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}):\n{log_path.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    stop_server(proc)
    raise SystemExit(f"/health was not 200 after {timeout} s:\n{log_path.read_text()[-3000:]}")


def stop_server(proc: subprocess.Popen, timeout: float = 60) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    proc.log.close()
    return code


def engine_line(log_path: Path) -> str | None:
    """The server's start-up line naming model, device, dtype and KV blocks."""
    for line in log_path.read_text(errors="replace").splitlines():
        if "engine: " in line:
            return line.split("engine: ")[-1]
    return None
