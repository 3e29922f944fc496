"""The `process` backend: each replica is a child `amity serve --port N` process of the
Suite, on a free port of 127.0.0.1, its output kept in DATA_DIR/replicas/<id>.log.

A child gets SIGTERM when the Suite dies (PR_SET_PDEATHSIG), so a killed Suite
leaves no orphans holding memory.
"""

import asyncio
import logging
import secrets
import signal
from pathlib import Path

from amity.suite.replicas.backend import Replica, ReplicaFailed, ReplicaSpec
from amity.suite.replicas.serve_command import (die_with_parent, free_port, log_tail,
                                                serve_argv, serve_env, wait_healthy)

log = logging.getLogger("amity.suite.replicas")


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
        argv = serve_argv(spec, "127.0.0.1", port)
        with open(log_path, "wb") as out:
            out.write((" ".join(argv) + "\n").encode())
            out.flush()
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=out, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL,
                env=serve_env(), preexec_fn=die_with_parent(signal.SIGTERM))
        replica = Replica(replica_id, f"http://127.0.0.1:{port}", spec, handle=proc)
        self.replicas.add(replica)
        log.info("replica %s of %s starting on port %d (log %s)", replica_id, spec.served_name,
                 port, log_path)
        try:
            why_not = await wait_healthy(replica.url, lambda: self.alive(replica),
                                         self.start_timeout_s)
            if why_not is not None:
                code = f" with code {proc.returncode}" if proc.returncode is not None else ""
                raise ReplicaFailed(f"{why_not}{code}:\n{log_tail(log_path)}")
        except BaseException:
            await self.stop(replica)
            raise
        log.info("replica %s of %s is ready at %s", replica_id, spec.served_name, replica.url)
        return replica

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
