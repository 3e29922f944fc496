"""The engine's LoRA adapters: which route holds which slot.

Each loaded adapter holds one of the model's `--max-loras` slots from load to
unload, so every adapter a step could need is always resident and any mix of them
runs in one batch (vLLM instead swaps adapters from a larger CPU pool into its
slots; here the slots are the pool). Reading and checking an adapter's files
(`read`) runs on any thread; writing it into the model (`install`, `remove`) on
the engine thread, between steps.

Each load gets a fresh `cache_key`: it roots the request's prefix-cache hash
chain (kv_cache_manager.py), so two adapters, or an adapter unloaded and another
loaded under its name, never share KV blocks.
"""

import itertools
from dataclasses import dataclass
from pathlib import Path

from amity.models.lora import LoraSlots
from amity.models.peft_adapter import AdapterError, LoraAdapter, read_adapter


class AdapterNotFound(AdapterError):
    """No adapter is loaded under that route."""


class AdapterInUse(AdapterError):
    """The adapter still has requests in flight."""


@dataclass(frozen=True)
class LoadedAdapter:
    route: str
    path: Path
    slot: int
    cache_key: bytes


class LoraManager:
    def __init__(self, slots: LoraSlots):
        self.slots = slots
        # Replaced, never mutated: other threads read it without a lock.
        self.adapters: dict[str, LoadedAdapter] = {}
        self._load_ids = itertools.count()

    def read(self, path: str | Path) -> LoraAdapter:
        return read_adapter(path, self.slots.layer_shapes, self.slots.num_layers, self.slots.max_rank)

    def get(self, route: str) -> LoadedAdapter:
        adapter = self.adapters.get(route)
        if adapter is None:
            raise AdapterNotFound(f"no LoRA adapter {route!r} is loaded; loaded: {sorted(self.adapters)}")
        return adapter

    def install(self, route: str, adapter: LoraAdapter) -> LoadedAdapter:
        if not route:
            raise AdapterError("an adapter needs a non-empty name")
        if route in self.adapters:
            raise AdapterError(f"a LoRA adapter named {route!r} is already loaded; unload it first")
        taken = {a.slot for a in self.adapters.values()}
        free = [s for s in range(self.slots.max_loras) if s not in taken]
        if not free:
            raise AdapterError(f"all {self.slots.max_loras} adapter slots (--max-loras) are taken; "
                               "unload an adapter first")
        loaded = LoadedAdapter(route, adapter.path, free[0], f"lora-{next(self._load_ids)}".encode())
        self.slots.write(loaded.slot, adapter)
        self.adapters = {**self.adapters, route: loaded}
        return loaded

    def remove(self, route: str, num_requests_in_flight: int) -> None:
        loaded = self.get(route)
        if num_requests_in_flight:
            raise AdapterInUse(f"LoRA adapter {route!r} has {num_requests_in_flight} requests in flight; "
                               "unload it once they finish")
        self.adapters = {k: v for k, v in self.adapters.items() if k != route}
        self.slots.write(loaded.slot, None)
