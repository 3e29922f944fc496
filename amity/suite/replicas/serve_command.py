"""One replica process, as every backend starts it: `amity serve` on a free port of an
address (and a Unix socket, where the Suite runs it), its output in a log file,
tied to its parent's life, ready once its `/health` answers 200.

The starter binds and listens on the port itself and hands the socket to the child
(`amity serve --fd`): a port merely found free and bound again by the child seconds
later (its imports, longer on a loaded machine) could be taken meanwhile, and the
replica would exit at start with "address already in use"."""

import asyncio
import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from amity.suite.replicas.backend import ReplicaSpec

PR_SET_PDEATHSIG = 1


def listening_socket(host: str) -> socket.socket:
    """A TCP socket listening on a port of `host` that the kernel chose, for a child to
    inherit (its `fileno()`: `pass_fds`)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((host, 0))
    listener.listen(socket.SOMAXCONN)
    return listener


def serve_argv(spec: ReplicaSpec, listener: socket.socket, uds: Path | None = None) -> list[str]:
    """`--host` and `--port` only say where the inherited socket listens (in `ps`, in
    the replica's log)."""
    host, port = listener.getsockname()[:2]
    named = ("--served-model-name", spec.served_name) if spec.served_name else ()
    unix_socket = ("--uds", str(uds)) if uds else ()
    return [sys.executable, "-m", "amity.cli", "serve", "--model", spec.model, *named,
            "--host", host, "--port", str(port), "--fd", str(listener.fileno()), *unix_socket,
            *spec.flags]


def serve_env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def die_with_parent(sig: signal.Signals) -> Callable[[], None]:
    """A `preexec_fn` that has the child get `sig` when its parent dies."""
    def preexec() -> None:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
        except (OSError, AttributeError):  # not Linux: orphans are possible, nothing more
            pass
    return preexec


def log_tail(path: Path, num_bytes: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - num_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


async def wait_healthy(client: httpx.AsyncClient, url: str, alive: Callable[[], bool],
                       timeout_s: float) -> str | None:
    """None once `url`/health answers 200 through `client` (the one requests will
    take); otherwise why not (the replica ended, or `timeout_s` passed)."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not alive():
            return "the replica exited"
        try:
            if (await client.get(url + "/health", timeout=5)).status_code == 200:
                return None
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            return f"the replica was not healthy after {timeout_s:.0f} s"
        await asyncio.sleep(0.25)
