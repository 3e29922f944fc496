"""The `process` backend: each replica is a child `amity serve --fd N --uds PATH`
process of the Suite, on a free port of 127.0.0.1 (its socket bound by the Suite and
inherited) and the Unix socket DATA_DIR/replicas/<id>.sock, its output kept in
DATA_DIR/replicas/<id>.log.

The Suite reaches a replica over its socket (cheaper per streamed chunk than
loopback TCP); the port is for what takes a URL (serverless tool loops, the
knowledge embedder). A data directory too deep for a socket path (108 bytes on
Linux) leaves replicas on TCP alone. The socket file goes when the replica stops
(the Suite removes it after a kill -9 too, and at its own start those that a killed
Suite left); `amity serve --uds` itself replaces a stale socket file at its path.

A child gets SIGTERM when the Suite dies (PR_SET_PDEATHSIG), so a killed Suite
leaves no orphans holding memory.
"""

import asyncio
import contextlib
import logging
import os
import secrets
import signal
from pathlib import Path

from amity.suite.replicas.backend import Replica, ReplicaFailed, ReplicaSpec
from amity.suite.replicas.proxy import new_client
from amity.suite.replicas.serve_command import (die_with_parent, listening_socket, log_tail,
                                                serve_argv, serve_env, wait_healthy)

log = logging.getLogger("amity.suite.replicas")
MAX_SOCKET_PATH_BYTES = 107  # sun_path holds 108, its NUL included


class ProcessBackend:
    def __init__(self, log_dir: Path, start_timeout_s: float, stop_timeout_s: float = 30.0):
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.log_dir.glob("*.sock"):  # a killed Suite's replicas left them
            stale.unlink(missing_ok=True)
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.replicas: set[Replica] = set()

    async def start(self, spec: ReplicaSpec) -> Replica:
        replica_id = f"rep_{secrets.token_hex(6)}"
        log_path = self.log_dir / f"{replica_id}.log"
        uds = self._socket_path(replica_id)
        with listening_socket("127.0.0.1") as listener, open(log_path, "wb") as out:
            port = listener.getsockname()[1]
            argv = serve_argv(spec, listener, uds)
            out.write((" ".join(argv) + "\n").encode())
            out.flush()
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=out, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                env=serve_env(), preexec_fn=die_with_parent(signal.SIGTERM),
                pass_fds=(listener.fileno(),))
        replica = Replica(replica_id, f"http://127.0.0.1:{port}", spec,
                          new_client(str(uds) if uds else None), handle=proc)
        self.replicas.add(replica)
        log.info("replica %s of %s starting on port %d and socket %s (log %s)", replica_id,
                 spec.served_name, port, uds, log_path)
        try:
            why_not = await wait_healthy(replica.client, replica.url, lambda: self.alive(replica),
                                         self.start_timeout_s)
            if why_not is not None:
                code = f" with code {proc.returncode}" if proc.returncode is not None else ""
                raise ReplicaFailed(f"{why_not}{code}:\n{log_tail(log_path)}")
        except BaseException:
            await self.stop(replica)
            raise
        log.info("replica %s of %s is ready at %s", replica_id, spec.served_name, replica.url)
        return replica

    def _socket_path(self, replica_id: str) -> Path | None:
        path = self.log_dir / f"{replica_id}.sock"
        return path if len(os.fsencode(path)) <= MAX_SOCKET_PATH_BYTES else None

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
        await replica.client.aclose()
        uds = self._socket_path(replica.id)
        if uds is not None:  # a replica killed by force left it
            with contextlib.suppress(FileNotFoundError):
                uds.unlink()

    async def close(self) -> None:
        await asyncio.gather(*(self.stop(r) for r in list(self.replicas)))
