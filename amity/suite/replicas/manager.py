"""The Suite's replicas: the backend they run on (which gives the HTTP clients that
reach them), and the sets kept at a fixed size under a name (the default model's container,
serverless catalog models). Dedicated endpoints size their own sets (the
controller); every set of either kind is on this one backend.

For other parts of the Suite: `await manager.ensure(name, spec)` returns a ReplicaSet
with at least one ready replica, kept alive (a dead replica is replaced by the
supervision loop) until `drop(name)`; `lease` on it reaches one.
"""

import asyncio
import logging
import shlex
from pathlib import Path

from amity.config import SuiteConfig
from amity.suite.replicas.backend import ReplicaBackend, ReplicaFailed, ReplicaSpec
from amity.suite.replicas.pool import ReplicaSet
from amity.suite.replicas.process import ProcessBackend

log = logging.getLogger("amity.suite.replicas")


def open_backend(config: SuiteConfig, data_dir: Path) -> ReplicaBackend:
    """The backend `--replicas` names."""
    if config.replicas == "ray":
        try:  # imported here: `ray` is optional, and slow to import
            from amity.suite.replicas.ray_backend import RayBackend
        except ModuleNotFoundError as error:
            raise RuntimeError(f"--replicas ray needs the ray package (pip install "
                               f"ray==2.60.0): {error}") from error
        return RayBackend(config.ray_address, data_dir / "replicas",
                          config.replica_start_timeout_s, config.ray_replica_cpus)
    return ProcessBackend(data_dir / "replicas", config.replica_start_timeout_s)


class ReplicaManager:
    def __init__(self, backend: ReplicaBackend, config: SuiteConfig):
        self.backend, self.config = backend, config
        self.common_flags = tuple(shlex.split(config.replica_args))
        self.named: dict[str, tuple[ReplicaSet, int]] = {}
        self.failures: dict[str, str] = {}  # name -> why its last start failed
        self._supervisor: asyncio.Task | None = None

    def new_set(self, spec: ReplicaSpec, concurrency: int | None = None) -> ReplicaSet:
        return ReplicaSet(self.backend, spec, concurrency or self.config.replica_concurrency)

    async def ensure(self, name: str, spec: ReplicaSpec, count: int = 1) -> ReplicaSet:
        """`count` replicas of `spec` under `name`, started if they are not; a set of
        another spec under the same name is replaced. Raises ReplicaFailed."""
        current = self.named.get(name)
        if current is None or current[0].spec != spec:
            if current is not None:
                await current[0].close()
            current = (self.new_set(spec), count)
            self.named[name] = current
        replica_set = current[0]
        self.named[name] = (replica_set, count)
        try:
            await replica_set.scale_to(count)
        except ReplicaFailed as error:
            self.failures[name] = str(error)
            raise
        self.failures.pop(name, None)
        return replica_set

    async def drop(self, name: str) -> None:
        """Stop the set under `name` and forget it (the supervisor no longer restarts it)."""
        current = self.named.pop(name, None)
        self.failures.pop(name, None)
        if current is not None:
            await current[0].close()

    async def supervise(self, interval_s: float) -> None:
        """Replace the dead replicas of the named sets, forever."""
        while True:
            await asyncio.sleep(interval_s)
            for name, (replica_set, count) in list(self.named.items()):
                if await replica_set.reap() or len(replica_set.replicas) < count:
                    try:
                        await replica_set.scale_to(count)
                        self.failures.pop(name, None)
                    except ReplicaFailed as error:
                        self.failures[name] = str(error)
                        log.error("cannot restart a replica of %s: %s", name, error)

    def start(self) -> None:
        self._supervisor = asyncio.get_running_loop().create_task(
            self.supervise(self.config.autoscale_interval_s))

    async def close(self) -> None:
        if self._supervisor is not None:
            self._supervisor.cancel()
        await asyncio.gather(*(s.close() for s, _ in self.named.values()), return_exceptions=True)
        await self.backend.close()
