"""Which replica serves a catalog model: shared replicas the Suite starts itself, one
set per model, on the replica manager (the dedicated endpoints' backend).

- A model's replicas start on its first request (the request waits for them, up to
  --wake-timeout-s, then gets a 503 with Retry-After; the start goes on, and the
  retry finds it ready). They serve under the catalog id (`--served-model-name`),
  so `model` in requests and answers is the catalog id.
- `replicas = "always-on"`: once started, kept running (a dead replica is replaced);
  `"scale-to-zero"`: stopped after --serverless-cooldown-s without requests, started
  again by the next one.
- A start that fails is a 503 naming why (the end of the replica's log); the next
  request tries again.
- `--serverless-model-urls ID=URL` overrides: that model's requests go to a container
  the operator runs (it must serve under the catalog id for the inference routes).
- Besides the catalog's models, the Suite's own (the knowledge embedder) are served
  the same way: anything with an id, a source and a replicas policy (SharedModel).
"""

import asyncio
import logging
import time
from pathlib import Path
from typing import Protocol

from amity.config import SuiteConfig
from amity.suite.replicas.backend import ReplicaFailed, ReplicaSpec
from amity.suite.replicas.manager import ReplicaManager
from amity.suite.replicas.pool import Lease, ReplicaSet
from amity.suite.replicas.proxy import new_client
from amity.suite.serverless.sources import model_path

log = logging.getLogger("amity.suite.serverless")
SET_PREFIX = "serverless:"  # the manager's name of a catalog model's replica set


class SharedModel(Protocol):
    """What shared replicas need of a model (a CatalogEntry is one)."""
    id: str
    source: str  # sources.model_path
    replicas: str  # "always-on" | "scale-to-zero"


class StartFailed(Exception):
    """A catalog model's replica could not start; the message says why."""


def parse_model_urls(spec: str | None) -> dict[str, str]:
    """`--serverless-model-urls`: `ID=URL,ID=URL`."""
    urls: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in (spec or "").split(","))):
        model_id, sep, url = item.partition("=")
        if not sep or not model_id or not url.startswith(("http://", "https://")):
            raise ValueError(f"--serverless-model-urls takes ID=URL items, not {item!r}")
        urls[model_id] = url.rstrip("/")
    return urls


class ServerlessReplicas:
    def __init__(self, manager: ReplicaManager, config: SuiteConfig, overrides: dict[str, str],
                 cache_dir: Path):
        self.manager, self.config, self.overrides = manager, config, overrides
        self._override_client = new_client() if overrides else None  # over TCP to their URLs
        self.cache_dir = cache_dir  # where `parts:` sources are assembled
        self.scale_to_zero: set[str] = set()  # set names to stop when idle
        self._starting: dict[str, asyncio.Task] = {}
        self._sweeper: asyncio.Task | None = None

    async def lease(self, entry: SharedModel) -> Lease:
        """A slot for one request on a replica of `entry`. Raises TimeoutError (not
        ready within the wait), StartFailed, QueueTimeout (every slot busy)."""
        if entry.id in self.overrides:
            return Lease(self.overrides[entry.id], self._override_client, lambda: None)
        replicas = await self._ready(entry)
        # No await between the set being ready and the slot being taken: the sweeper
        # never sees a set idle that a request is about to use.
        return await replicas.lease(self.config.queue_timeout_s)

    async def _ready(self, entry: SharedModel) -> ReplicaSet:
        name = SET_PREFIX + entry.id
        current = self.manager.named.get(name)
        if current is not None and current[0].replicas and name not in self._starting:
            return current[0]
        task = self._starting.get(name)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._start(entry, name))
            self._starting[name] = task
            task.add_done_callback(lambda _: self._starting.pop(name, None))
        try:
            # Shielded: a request that stops waiting does not stop the start.
            return await asyncio.wait_for(asyncio.shield(task), self.config.wake_timeout_s)
        except TimeoutError:
            raise TimeoutError(f"{entry.id} is still starting after "
                               f"{self.config.wake_timeout_s:g} s") from None

    async def _start(self, entry: SharedModel, name: str) -> ReplicaSet:
        try:
            # Assembling a split GGUF reads hundreds of MB: not on the event loop.
            path = await asyncio.to_thread(model_path, entry.source, self.cache_dir)
            spec = ReplicaSpec(str(path), entry.id, self.manager.common_flags)
            log.info("starting a shared replica of %s (%s)", entry.id, path)
            replicas = await self.manager.ensure(name, spec)
        except (OSError, ValueError, ReplicaFailed) as error:
            await self.manager.drop(name)  # not retried in the background: the next request does
            raise StartFailed(f"{entry.id} could not start: {error}") from None
        if entry.replicas == "scale-to-zero":
            self.scale_to_zero.add(name)
        return replicas

    async def sweep(self, interval_s: float) -> None:
        """Stop the scale-to-zero models idle for the cooldown, forever."""
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            for name in list(self.scale_to_zero):
                current = self.manager.named.get(name)
                if current is None:
                    self.scale_to_zero.discard(name)
                    continue
                replicas = current[0]
                idle_s = now - replicas.last_request_s
                if (replicas.outstanding == 0 and idle_s >= self.config.serverless_cooldown_s
                        and name not in self._starting):
                    log.info("%s: idle for %.0f s, scaling to zero", name, idle_s)
                    self.scale_to_zero.discard(name)
                    await self.manager.drop(name)

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(
            self.sweep(self.config.autoscale_interval_s))

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for task in list(self._starting.values()):
            task.cancel()
        if self._override_client is not None:
            await self._override_client.aclose()
