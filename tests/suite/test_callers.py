"""The Suite's cache of checked callers (callers.py): concurrent misses of one key
share one lookup, a failed lookup reaches every waiter and is not kept, an entry
expires."""

import asyncio
from types import SimpleNamespace

import pytest

from amity.suite import callers
from amity.suite.callers import TtlCache


def test_concurrent_misses_share_one_lookup_and_failures_are_not_kept(monkeypatch):
    # The cache's clock moves only when the test moves it: a slow machine cannot expire an entry.
    now_s = [1000.0]
    monkeypatch.setattr(callers, "time", SimpleNamespace(monotonic=lambda: now_s[0]))
    lookups = []

    async def look_up(key, fail=False):
        lookups.append(key)
        await asyncio.sleep(0.05)
        if fail:
            raise PermissionError(key)
        return f"caller of {key}"

    async def scenario():
        cache = TtlCache(ttl_s=10)
        values = await asyncio.gather(*(cache.get_or_load("a", lambda: look_up("a")) for _ in range(32)))
        assert values == ["caller of a"] * 32 and lookups == ["a"]
        assert await cache.get_or_load("a", lambda: look_up("a")) == "caller of a"
        assert lookups == ["a"]  # kept
        failed = await asyncio.gather(*(cache.get_or_load("b", lambda: look_up("b", fail=True))
                                        for _ in range(3)), return_exceptions=True)
        assert all(isinstance(f, PermissionError) for f in failed) and lookups == ["a", "b"]
        with pytest.raises(PermissionError):  # not kept: looked up again
            await cache.get_or_load("b", lambda: look_up("b", fail=True))
        assert lookups == ["a", "b", "b"]
        now_s[0] += 9.9
        assert await cache.get_or_load("a", lambda: look_up("a")) == "caller of a"
        assert lookups == ["a", "b", "b"]  # not yet expired
        now_s[0] += 0.1  # "a" expires
        assert await cache.get_or_load("a", lambda: look_up("a")) == "caller of a"
        assert lookups == ["a", "b", "b", "a"]

    asyncio.run(scenario())


def test_a_waiter_that_gives_up_does_not_cancel_the_others_lookup():
    async def look_up():
        await asyncio.sleep(0.05)
        return "caller"

    async def scenario():
        cache = TtlCache(ttl_s=10)
        first = asyncio.create_task(cache.get_or_load("a", look_up))
        second = asyncio.create_task(cache.get_or_load("a", look_up))
        await asyncio.sleep(0.01)
        first.cancel()
        assert await second == "caller"

    asyncio.run(scenario())
