"""A set of replicas of one spec, and the requests in flight on them.

`acquire()` picks the replica with the fewest outstanding requests among those with a
free slot (at most `concurrency` each) and waits, up to `queue_timeout_s`, when all
are full: that wait is the endpoint's queue, and its timeout a 429. `scale_to()`
starts or stops replicas; `reap()` drops the dead ones (their requests in flight
fail on their own: the connection to a dead process breaks).
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from amity.suite.replicas.backend import Replica, ReplicaBackend, ReplicaSpec

log = logging.getLogger("amity.suite.replicas")


class QueueTimeout(Exception):
    pass


@dataclass(frozen=True)
class Lease:
    """One request's slot on a replica: where to send it, over which client, and what
    to call when done."""
    url: str
    client: httpx.AsyncClient
    release: Callable[[], None]


class NoReplica(Exception):
    """The set has no replica (scaled to zero, or all died) and none is starting."""


class ReplicaSet:
    def __init__(self, backend: ReplicaBackend, spec: ReplicaSpec, concurrency: int):
        self.backend, self.spec, self.concurrency = backend, spec, concurrency
        self.replicas: list[Replica] = []
        self.waiting = 0                       # requests in the queue
        self.last_request_s = time.monotonic()  # when a request last arrived or ended
        self._changed = asyncio.Condition()
        self._scaling = asyncio.Lock()

    @property
    def outstanding(self) -> int:
        """Requests in flight plus those queued: what autoscaling reads."""
        return sum(r.outstanding for r in self.replicas) + self.waiting

    def _pick(self) -> Replica | None:
        free = [r for r in self.replicas if r.outstanding < self.concurrency
                and self.backend.alive(r)]
        return min(free, key=lambda r: r.outstanding, default=None)

    async def acquire(self, queue_timeout_s: float) -> Replica:
        """A replica for one request (give it back with `release`)."""
        self.last_request_s = time.monotonic()
        async with self._changed:
            replica = self._pick()
            if replica is None:
                self.waiting += 1
                try:
                    replica = await asyncio.wait_for(self._changed.wait_for(self._pick),
                                                     queue_timeout_s)
                except TimeoutError:
                    raise QueueTimeout(f"no replica slot came free in {queue_timeout_s:g} s "
                                       f"({len(self.replicas)} replicas, {self.waiting} "
                                       "requests queued)") from None
                finally:
                    self.waiting -= 1
            replica.outstanding += 1
            return replica

    async def lease(self, queue_timeout_s: float) -> Lease:
        replica = await self.acquire(queue_timeout_s)
        return Lease(replica.url, replica.client, lambda: self.release(replica))

    def release(self, replica: Replica) -> None:
        replica.outstanding -= 1
        self.last_request_s = time.monotonic()
        asyncio.get_running_loop().create_task(self._notify())

    async def scale_to(self, count: int) -> None:
        """Start or stop replicas until there are `count`; the newest stop first,
        the idlest of them first. Raises ReplicaFailed when a start fails."""
        async with self._scaling:
            missing = count - len(self.replicas)
            if missing > 0:
                started = await asyncio.gather(*(self.backend.start(self.spec)
                                                 for _ in range(missing)), return_exceptions=True)
                for result in started:
                    if isinstance(result, Replica):
                        self.replicas.append(result)
                await self._notify()
                failure = next((r for r in started if isinstance(r, BaseException)), None)
                if failure is not None:
                    raise failure
            while len(self.replicas) > count:
                victim = min(reversed(self.replicas), key=lambda r: r.outstanding)
                self.replicas.remove(victim)
                await self.backend.stop(victim)

    async def reap(self) -> list[Replica]:
        """Drop and return the replicas that died."""
        dead = [r for r in self.replicas if not self.backend.alive(r)]
        for replica in dead:
            log.warning("replica %s of %s died; its log is %s.log", replica.id,
                        self.spec.served_name, replica.id)
            self.replicas.remove(replica)
            await self.backend.stop(replica)
        return dead

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def close(self) -> None:
        await self.scale_to(0)
