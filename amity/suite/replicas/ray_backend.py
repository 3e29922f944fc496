"""The `ray` backend (`--replicas ray --ray-address ADDR`): each replica is a Ray actor
(ServeReplica) on a Ray cluster, running `amity serve` on the node Ray placed it on;
the actor answers the replica's URL and the Suite routes to it over HTTP as to a local
process. The controller keeps its own scaling (Ray Serve's autoscaler and proxy are not
used): scaling out creates actors, scaling in or to zero (minReplica 0: SLEEPING)
kills them and frees their resources on the cluster.

Each actor reserves `--ray-replica-cpus` CPUs, so Ray spreads replicas over nodes with
room and holds a start back (up to --replica-start-timeout-s) while none has. An actor
that dies, or whose process exits, is dead to `alive` (the Suite awaits the actor's
`wait()`, which fails when the actor dies) and is replaced by the controller. Actors
belong to the Suite's Ray job: when the Suite exits, Ray ends them and their replicas.
Every node needs amity installed in the Python that runs Ray's workers; a replica's log
is DATA_DIR/replicas/<id>.log on the node that runs it.
"""

import asyncio
import logging
import secrets
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.exceptions import RayError

from amity.suite.replicas.backend import Replica, ReplicaFailed, ReplicaSpec
from amity.suite.replicas.proxy import new_client
from amity.suite.replicas.ray_replica import ServeReplica
from amity.suite.replicas.serve_command import wait_healthy

log = logging.getLogger("amity.suite.replicas")
NAMESPACE = "amity"  # actors are named by replica id in it


@dataclass(eq=False)
class RayReplica:
    actor: "ray.actor.ActorHandle"
    ended: str | None = None            # why the actor or its process ended (None: alive)
    watcher: asyncio.Task | None = None


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """ray.init retries an address that nothing answers on for minutes: a clear error
    at once instead."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as error:
        raise RuntimeError(f"--ray-address {address}: no Ray head answers there ({error})") from None


class RayBackend:
    def __init__(self, address: str | None, log_dir: Path, start_timeout_s: float,
                 replica_cpus: float, stop_timeout_s: float = 30.0):
        # Ray's core installs its own SIGTERM/SIGINT handlers, which end the process at
        # once; the server's, which stop it gracefully, are put back (Python sets
        # handlers from the main thread only, where uvicorn runs the Suite).
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
        if address not in (None, "auto"):
            _check_reachable(address)
        # Replicas' output stays in their logs, not in the Suite's.
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                 logging_level=logging.WARNING)
        if threading.current_thread() is threading.main_thread():
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)
        # wait() blocks one of the actor's threads for the replica's life; start, stop
        # and log_tail use the others.
        self.actor_class = ray.remote(max_restarts=0, max_concurrency=4)(ServeReplica)
        self.log_dir = log_dir
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.replica_cpus = replica_cpus
        self.replicas: set[Replica] = set()
        self.client = new_client()  # over TCP: replicas may be on other nodes

    async def start(self, spec: ReplicaSpec) -> Replica:
        replica_id = f"rep_{secrets.token_hex(6)}"
        deadline = time.monotonic() + self.start_timeout_s
        actor = self.actor_class.options(name=replica_id, num_cpus=self.replica_cpus).remote(
            str(self.log_dir / f"{replica_id}.log"))
        replica = Replica(replica_id, "", spec, self.client, handle=RayReplica(actor))
        self.replicas.add(replica)
        log.info("replica %s of %s: Ray actor requested", replica_id, spec.served_name)
        try:
            try:
                replica.url = await asyncio.wait_for(actor.start.remote(spec), self.start_timeout_s)
            except TimeoutError:
                replica.handle.ended = "not placed"
                raise ReplicaFailed(f"Ray did not place the replica in {self.start_timeout_s:.0f} s "
                                    f"(does a node have {self.replica_cpus:g} CPUs free?)") from None
            except RayError as error:
                replica.handle.ended = "failed to start"
                raise ReplicaFailed(f"the replica's Ray actor failed: {error}") from None
            replica.handle.watcher = asyncio.get_running_loop().create_task(self._watch(replica))
            why_not = await wait_healthy(self.client, replica.url, lambda: self.alive(replica),
                                         deadline - time.monotonic())
            if why_not is not None:
                ended = f" ({replica.handle.ended})" if replica.handle.ended else ""
                raise ReplicaFailed(f"{why_not}{ended}:\n{await self._log_tail(replica)}")
        except BaseException:
            await self.stop(replica)
            raise
        log.info("replica %s of %s is ready at %s", replica_id, spec.served_name, replica.url)
        return replica

    async def _watch(self, replica: Replica) -> None:
        handle: RayReplica = replica.handle
        try:
            handle.ended = f"its process exited with code {await handle.actor.wait.remote()}"
        except RayError as error:
            handle.ended = f"its Ray actor died: {type(error).__name__}"
        log.info("replica %s of %s: %s", replica.id, replica.spec.served_name, handle.ended)

    async def _log_tail(self, replica: Replica) -> str:
        try:
            return await asyncio.wait_for(replica.handle.actor.log_tail.remote(), 30)
        except (RayError, TimeoutError) as error:
            return f"(its log on the replica's node could not be read: {error!r})"

    def alive(self, replica: Replica) -> bool:
        return replica.handle.ended is None

    async def stop(self, replica: Replica) -> None:
        handle: RayReplica = replica.handle
        self.replicas.discard(replica)
        if handle.ended is None:
            try:
                await asyncio.wait_for(handle.actor.stop.remote(self.stop_timeout_s),
                                       self.stop_timeout_s + 10)
            except (RayError, TimeoutError):
                pass  # killing the actor below kills its process too
        if handle.watcher is not None:
            handle.watcher.cancel()
        ray.kill(handle.actor, no_restart=True)  # frees the actor's resources on the cluster

    async def close(self) -> None:
        await asyncio.gather(*(self.stop(r) for r in list(self.replicas)))
        await self.client.aclose()
        ray.shutdown()
