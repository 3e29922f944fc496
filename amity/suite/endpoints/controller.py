"""The endpoint controller: the state machine of platform-notes §1, run in the
Suite's event loop, with the database as the record.

    create/restart -> INITIALIZING (REQUESTING_VIRTUAL_MACHINE -> DOWNLOADING_MODEL
                      -> ENGINE_INITIALIZING) -> RUNNING | FAILED(errorCode)
    RUNNING -update-> UPDATING -> RUNNING      (a new version; replicas rolled)
    RUNNING -sleep, or idle for cooldownPeriod with minReplica 0-> SLEEPING
    SLEEPING -wake, or an inference request-> AWAKING -> RUNNING | FAILED
    live -terminate-> TERMINATING -> TERMINATED (configuration kept)
    FAILED | TERMINATED -restart-> INITIALIZING

Each endpoint has at most one transition task at a time; an operation that the
current state does not allow is an InvalidTransition (a 400, never a 503: clients
retry 5xx for an hour). `desired` (running, sleeping, terminated) is what a restart
of the Suite brings the endpoint back to. The autoscaling tick replaces dead
replicas, scales between minReplica and maxReplica on outstanding requests per
replica, scales down after cooldownPeriod without requests, and sleeps an idle
endpoint whose minReplica is 0.
"""

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from amity.config import SuiteConfig
from amity.suite.endpoints.repos import CannotResolve, resolve_model
from amity.suite.files.objects import ObjectStore
from amity.suite.replicas.backend import ReplicaFailed, ReplicaSpec
from amity.suite.replicas.manager import ReplicaManager
from amity.suite.replicas.pool import ReplicaSet
from amity.suite.store.models import Endpoint

log = logging.getLogger("amity.suite.endpoints")

SERVING = ("RUNNING",)
STARTING = ("INITIALIZING", "AWAKING", "UPDATING")


class InvalidTransition(Exception):
    pass


def utcnow() -> datetime:
    return datetime.now(UTC)


def scaling(config: dict) -> tuple[int, int, int]:
    """(minReplica, maxReplica, cooldownPeriod) of an endpoint's configuration."""
    return config["minReplica"], config["maxReplica"], config["cooldownPeriod"]


def replica_flags(config: dict) -> tuple[str, ...]:
    """`advanced` as `amity serve` flags."""
    advanced, flags = config["advanced"], []
    if advanced.get("max_batch_size"):
        flags += ["--max-num-seqs", str(advanced["max_batch_size"])]
    if advanced.get("max_token_count"):
        flags += ["--max-num-batched-tokens", str(advanced["max_token_count"])]
    if advanced.get("max_input_length"):
        flags += ["--max-model-len", str(advanced["max_input_length"])]
    return tuple(flags)


@dataclass
class Live:
    """What the controller holds for one endpoint besides its row."""
    status: str
    replica_set: ReplicaSet | None = None
    task: asyncio.Task | None = None
    config: dict = field(default_factory=dict)
    team_id: str = ""
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class Controller:
    def __init__(self, config: SuiteConfig, sessions: sessionmaker[Session], replicas: ReplicaManager,
                 objects: ObjectStore, registry: Path, cache: Path, artifacts):
        self.config, self.sessions, self.replicas = config, sessions, replicas
        self.objects, self.registry, self.cache, self.artifacts = objects, registry, cache, artifacts
        self.live: dict[str, Live] = {}
        self._ticker: asyncio.Task | None = None

    # --- records ---------------------------------------------------------------------

    def _record(self, endpoint_id: str, status: str, phase: str | None = None,
                error_code: str | None = None, error_message: str | None = None,
                desired: str | None = None) -> None:
        live = self.live.get(endpoint_id)
        with self.sessions.begin() as session:
            row = session.scalar(select(Endpoint).where(Endpoint.id == endpoint_id))
            if row is None:
                return
            row.status, row.phase, row.error_code = status, phase, error_code
            row.error_message = error_message
            row.updated_at = utcnow()
            if desired is not None:
                row.desired = desired
        if live is not None:
            live.status = status
            live.changed.set()
            live.changed = asyncio.Event()
        log.info("endpoint %s: %s%s%s", endpoint_id, status, f" ({phase})" if phase else "",
                 f" {error_code}: {error_message}" if error_code else "")

    def _spec(self, endpoint_id: str, config: dict, team_id: str) -> ReplicaSpec:
        with self.sessions() as session:
            path = resolve_model(config["hfModelRepo"], config.get("hfModelRepoRevision"),
                                 registry=self.registry, session=session, team_id=team_id,
                                 objects=self.objects, cache=self.cache, artifacts=self.artifacts)
        return ReplicaSpec(str(path), endpoint_id, self.replicas.common_flags + replica_flags(config))

    def _concurrency(self, config: dict) -> int:
        return config["advanced"].get("max_batch_size") or self.config.replica_concurrency

    # --- transitions (each runs as the endpoint's one task) -----------------------------

    def _run(self, endpoint_id: str, coroutine) -> None:
        live = self.live[endpoint_id]
        if live.task is not None and not live.task.done():
            live.task.cancel()
        live.task = asyncio.get_running_loop().create_task(self._guarded(endpoint_id, coroutine))

    async def _guarded(self, endpoint_id: str, coroutine) -> None:
        try:
            await coroutine
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a bug must still leave a visible state
            log.exception("endpoint %s: transition failed", endpoint_id)
            self._record(endpoint_id, "FAILED", error_code="WORKLOAD_INIT_UNKNOWN_ERROR",
                         error_message=repr(error))

    async def _bring_up(self, endpoint_id: str, status: str) -> None:
        """INITIALIZING or AWAKING through the phases to RUNNING, or FAILED."""
        live = self.live[endpoint_id]
        if status == "INITIALIZING":
            self._record(endpoint_id, status, "DOWNLOADING_MODEL")
        try:
            spec = await asyncio.to_thread(self._spec, endpoint_id, live.config, live.team_id)
        except CannotResolve as error:
            self._record(endpoint_id, "FAILED", error_code=error.error_code, error_message=str(error))
            return
        self._record(endpoint_id, status, "ENGINE_INITIALIZING", desired="running")
        old = live.replica_set
        if old is None or old.spec != spec:
            live.replica_set = self.replicas.new_set(spec, self._concurrency(live.config))
        minimum, _, _ = scaling(live.config)
        try:
            await live.replica_set.scale_to(max(minimum, 1))
        except ReplicaFailed as error:
            await live.replica_set.close()
            self._record(endpoint_id, "FAILED", error_code="INFERENCE_ENGINE_UNKNOWN_ERROR",
                         error_message=str(error)[-2000:])
            return
        if old is not None and old is not live.replica_set:
            await old.close()  # a rolled update: the old replicas go once the new serve
        live.replica_set.last_request_s = time.monotonic()
        self._record(endpoint_id, "RUNNING", desired="running")

    async def _bring_down(self, endpoint_id: str, final: str, transient: str | None) -> None:
        live = self.live[endpoint_id]
        desired = "terminated" if final == "TERMINATED" else "sleeping"
        if transient:
            self._record(endpoint_id, transient, desired=desired)
        if live.replica_set is not None:
            await live.replica_set.close()
        self._record(endpoint_id, final, desired=desired)

    # --- operations --------------------------------------------------------------------

    def track(self, row: Endpoint) -> Live:
        live = self.live.get(row.id)
        if live is None:
            live = self.live[row.id] = Live(row.status)
        live.config, live.team_id = dict(row.config), row.team_id
        return live

    def deploy(self, row: Endpoint) -> None:
        """A new endpoint (or one restarted): INITIALIZING from the first phase."""
        self.track(row)
        self._record(row.id, "INITIALIZING", "REQUESTING_VIRTUAL_MACHINE", desired="running")
        self._run(row.id, self._bring_up(row.id, "INITIALIZING"))

    def _status(self, endpoint_id: str) -> str:
        live = self.live.get(endpoint_id)
        return live.status if live else "UNKNOWN"

    def restart(self, row: Endpoint) -> None:
        if row.status not in ("FAILED", "TERMINATED"):
            raise InvalidTransition(f"only a FAILED or TERMINATED endpoint restarts; this one "
                                    f"is {row.status}")
        self.deploy(row)

    def sleep(self, row: Endpoint) -> None:
        if row.status == "SLEEPING":
            return
        if row.status not in ("RUNNING", "INITIALIZING", "AWAKING", "UPDATING"):
            raise InvalidTransition(f"a {row.status} endpoint cannot sleep")
        self.track(row)
        self._record(row.id, "SLEEPING", desired="sleeping")  # as the spec's example answers
        self._run(row.id, self._bring_down(row.id, "SLEEPING", None))

    def wake(self, row: Endpoint) -> None:
        """SLEEPING -> AWAKING; waking one that runs or wakes already is a no-op."""
        if row.status in ("RUNNING", "AWAKING", "INITIALIZING", "UPDATING"):
            return
        if row.status != "SLEEPING":
            raise InvalidTransition(f"a {row.status} endpoint cannot wake; restart it")
        self.track(row)
        self._record(row.id, "AWAKING", "ENGINE_INITIALIZING", desired="running")
        self._run(row.id, self._bring_up(row.id, "AWAKING"))

    def terminate(self, row: Endpoint) -> None:
        if row.status in ("TERMINATED", "TERMINATING"):
            raise InvalidTransition(f"the endpoint is {row.status} already")
        self.track(row)
        self._record(row.id, "TERMINATING", desired="terminated")
        self._run(row.id, self._bring_down(row.id, "TERMINATED", None))

    @staticmethod
    def check_update(status: str) -> None:
        if status in ("INITIALIZING", "AWAKING", "UPDATING", "TERMINATING"):
            raise InvalidTransition(f"the endpoint is {status}; update it once that is over")

    def update(self, row: Endpoint, rolls: bool) -> None:
        """`row.config` is the new configuration. A running endpoint whose replicas
        change rolls them (UPDATING); otherwise the configuration is simply kept."""
        self.check_update(row.status)
        live = self.track(row)
        if row.status == "RUNNING" and rolls:
            self._record(row.id, "UPDATING", "ENGINE_INITIALIZING")
            self._run(row.id, self._bring_up(row.id, "UPDATING"))
        elif row.status == "RUNNING" and live.replica_set is not None:
            live.replica_set.concurrency = self._concurrency(live.config)

    async def delete(self, endpoint_id: str) -> None:
        live = self.live.pop(endpoint_id, None)
        if live is None:
            return
        if live.task is not None and not live.task.done():
            live.task.cancel()
            await asyncio.gather(live.task, return_exceptions=True)
        if live.replica_set is not None:
            await live.replica_set.close()
        live.status = "DELETED"
        live.changed.set()

    # --- serving -----------------------------------------------------------------------

    async def serving_set(self, endpoint_id: str, timeout_s: float) -> ReplicaSet:
        """The replicas of a RUNNING endpoint; a SLEEPING one is woken and waited for
        (as is one starting), up to `timeout_s`. InvalidTransition for an endpoint that
        will not serve by itself; TimeoutError when it did not get there in time."""
        deadline = time.monotonic() + timeout_s
        while True:
            live = self.live.get(endpoint_id)
            if live is None:
                raise InvalidTransition("the endpoint was deleted")
            if live.status == "RUNNING" and live.replica_set is not None:
                return live.replica_set
            if live.status == "SLEEPING":
                with self.sessions() as session:
                    row = session.scalar(select(Endpoint).where(Endpoint.id == endpoint_id))
                    self.wake(row)
                continue
            if live.status in ("FAILED", "TERMINATED", "TERMINATING", "UNKNOWN"):
                raise InvalidTransition(f"the endpoint is {live.status}; restart it to serve")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the endpoint is still {live.status}")
            event = live.changed
            try:
                await asyncio.wait_for(event.wait(), left)
            except TimeoutError:
                pass

    # --- the loop ----------------------------------------------------------------------

    async def _tick(self) -> None:
        now = time.monotonic()
        for endpoint_id, live in list(self.live.items()):
            if live.status != "RUNNING" or live.replica_set is None:
                continue
            if live.task is not None and not live.task.done():
                continue  # a transition (or a scaling step) is under way
            replicas = live.replica_set
            dead = await replicas.reap()
            minimum, maximum, cooldown = scaling(live.config)
            load = replicas.outstanding
            count = len(replicas.replicas)
            idle_s = now - replicas.last_request_s
            want = min(max(math.ceil(load / self.config.target_outstanding), minimum, 1), maximum)
            if minimum == 0 and load == 0 and idle_s >= cooldown:
                log.info("endpoint %s: idle for %.0f s, sleeping", endpoint_id, idle_s)
                with self.sessions() as session:
                    self.sleep(session.scalar(select(Endpoint).where(Endpoint.id == endpoint_id)))
            elif want > count or dead:
                target = min(max(want, count + len(dead)), maximum)
                log.info("endpoint %s: %d replicas for %d outstanding requests (%d died)",
                         endpoint_id, target, load, len(dead))
                live.task = asyncio.get_running_loop().create_task(
                    self._scale(endpoint_id, replicas, target))
            elif want < count and idle_s >= cooldown:
                live.task = asyncio.get_running_loop().create_task(
                    self._scale(endpoint_id, replicas, count - 1))

    async def _scale(self, endpoint_id: str, replicas: ReplicaSet, count: int) -> None:
        try:
            await replicas.scale_to(count)
        except ReplicaFailed as error:
            log.error("endpoint %s: a replica did not start: %s", endpoint_id, error)
            if not replicas.replicas:
                self._record(endpoint_id, "FAILED", error_code="INFERENCE_ENGINE_UNKNOWN_ERROR",
                             error_message=str(error)[-2000:])

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.autoscale_interval_s)
            try:
                await self._tick()
            except Exception:
                log.exception("the endpoint controller's tick failed")

    def counts(self, endpoint_id: str) -> tuple[int, int]:
        """(current, desired) replica counts."""
        live = self.live.get(endpoint_id)
        if live is None or live.replica_set is None:
            return 0, 0
        current = len(live.replica_set.replicas)
        return current, current if live.status == "RUNNING" else 0

    async def start(self) -> None:
        """Bring every endpoint back to its desired state (after a restart of the Suite)."""
        with self.sessions() as session:
            rows = session.scalars(select(Endpoint)).all()
        for row in rows:
            live = self.track(row)
            if row.desired == "running" and row.status != "FAILED":
                self.deploy(row)
            elif row.desired == "sleeping":
                live.status = "SLEEPING"
                self._record(row.id, "SLEEPING")
            elif row.desired == "terminated":
                self._record(row.id, "TERMINATED")
        self._ticker = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        for live in self.live.values():
            if live.task is not None and not live.task.done():
                live.task.cancel()
        await asyncio.gather(*(lv.task for lv in self.live.values() if lv.task), return_exceptions=True)
        await asyncio.gather(*(lv.replica_set.close() for lv in self.live.values() if lv.replica_set),
                             return_exceptions=True)
