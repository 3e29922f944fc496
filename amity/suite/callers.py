"""Callers the Suite has already authenticated, for `auth_cache_ttl_s` seconds.

Every inference request authenticates; through the router that is the hot path, and a
database query per request costs the replica CPU on a small machine. Tokens and
memberships change in the database from another process (`amity admin`), which this
one cannot hear about, so an entry simply expires. Only successes are kept: a token
created meanwhile is looked up on its first use. Concurrent misses of one key share one
lookup (`get_or_load`): a wave of requests that finds its entry expired would otherwise
send every request through the thread pool to the database at once, and reach the
replica spread over those lookups (benchmarks/README.md, "Router", Session 12).
"""

import asyncio
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

Value = TypeVar("Value")
MAX_ENTRIES = 10_000


class TtlCache(Generic[Value]):
    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._entries: dict[Hashable, tuple[float, Value]] = {}  # key -> (expires, value)
        self._loading: dict[Hashable, asyncio.Future] = {}       # key -> its lookup under way

    def get(self, key: Hashable) -> Value | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= time.monotonic():
            del self._entries[key]
            return None
        return entry[1]

    def put(self, key: Hashable, value: Value) -> None:
        if self.ttl_s <= 0:
            return
        if len(self._entries) >= MAX_ENTRIES:  # the oldest entry goes
            del self._entries[next(iter(self._entries))]
        self._entries[key] = (time.monotonic() + self.ttl_s, value)

    async def get_or_load(self, key: Hashable, load: Callable[[], Awaitable[Value]]) -> Value:
        """The value of `key`, from `load()` when it is missing; a miss while another
        caller's load of the same key is under way waits for that one (its failure
        too). Shielded: one waiter that gives up does not cancel the others' load."""
        value = self.get(key)
        if value is not None:
            return value
        loading = self._loading.get(key)
        if loading is None:
            loading = self._loading[key] = asyncio.ensure_future(load())
            loading.add_done_callback(lambda _: self._loading.pop(key, None))
        value = await asyncio.shield(loading)
        self.put(key, value)
        return value
