"""The `process` backend: each replica is a child `amity serve --port N` process of the
Suite, on a free port of 127.0.0.1, its output kept in DATA_DIR/replicas/<id>.log.

A child gets SIGTERM when the Suite dies (PR_SET_PDEATHSIG), so a killed Suite
leaves no orphans holding memory.
"""

import asyncio
import ctypes
import logging
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path

import httpx

from amity.suite.replicas.backend import Replica, ReplicaFailed, ReplicaSpec

log = logging.getLogger("amity.suite.replicas")
PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: orphans are possible, nothing more
        pass


def log_tail(path: Path, num_bytes: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - num_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


class ProcessBackend:
    def __init__(self, log_dir: Path, start_timeout_s: float, stop_timeout_s: float = 30.0):
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.replicas: set[Replica] = set()

    async def start(self, spec: ReplicaSpec) -> Replica:
        replica_id = f"rep_{secrets.token_hex(6)}"
        port = free_port()
        log_path = self.log_dir / f"{replica_id}.log"
        named = ("--served-model-name", spec.served_name) if spec.served_name else ()
        argv = [sys.executable, "-m", "amity.cli", "serve", "--model", spec.model, *named,
                "--host", "127.0.0.1", "--port", str(port), *spec.flags]
        with open(log_path, "wb") as out:
            out.write((" ".join(argv) + "\n").encode())
            out.flush()
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=out, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_die_with_parent)
        replica = Replica(replica_id, f"http://127.0.0.1:{port}", spec, handle=proc)
        self.replicas.add(replica)
        log.info("replica %s of %s starting on port %d (log %s)", replica_id, spec.served_name,
                 port, log_path)
        try:
            await self._wait_healthy(replica, log_path)
        except BaseException:
            await self.stop(replica)
            raise
        log.info("replica %s of %s is ready at %s", replica_id, spec.served_name, replica.url)
        return replica

    async def _wait_healthy(self, replica: Replica, log_path: Path) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
            while True:
                if not self.alive(replica):
                    raise ReplicaFailed(f"the replica exited with code {replica.handle.returncode}"
                                        f":\n{log_tail(log_path)}")
                try:
                    if (await client.get(replica.url + "/health")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise ReplicaFailed(f"the replica was not healthy after "
                                        f"{self.start_timeout_s:.0f} s:\n{log_tail(log_path)}")
                await asyncio.sleep(0.25)

    def alive(self, replica: Replica) -> bool:
        return replica.handle.returncode is None

    async def stop(self, replica: Replica) -> None:
        proc: asyncio.subprocess.Process = replica.handle
        self.replicas.discard(replica)
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), self.stop_timeout_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    async def close(self) -> None:
        await asyncio.gather(*(self.stop(r) for r in list(self.replicas)))
