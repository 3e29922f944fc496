"""Callers the Suite has already authenticated, for `auth_cache_ttl_s` seconds.

Every inference request authenticates; through the router that is the hot path, and a
database query per request costs the replica CPU on a small machine. Tokens and
memberships change in the database from another process (`amity admin`), which this
one cannot hear about, so an entry simply expires. Only successes are kept: a token
created meanwhile is looked up on its first use.
"""

import time
from collections.abc import Hashable
from typing import Generic, TypeVar

Value = TypeVar("Value")
MAX_ENTRIES = 10_000


class TtlCache(Generic[Value]):
    def __init__(self, ttl_s: float):
        self.ttl_s = ttl_s
        self._entries: dict[Hashable, tuple[float, Value]] = {}  # key -> (expires, value)

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
