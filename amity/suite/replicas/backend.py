"""The replica backend interface: what the controller asks of any place replicas run
(child processes here, Ray actors on a cluster). A replica is one container serving
one model on its spec paths at `url`; the backend starts it, gives the HTTP client
that reaches it, says whether it is still alive, and stops it."""

from dataclasses import dataclass, field
from typing import Protocol

import httpx


@dataclass(frozen=True)
class ReplicaSpec:
    model: str                    # a local model directory or GGUF file
    served_name: str | None       # what `model` says in requests and answers (None: the
                                  # container's own default, the model's file name)
    flags: tuple[str, ...] = ()   # more `amity serve` flags (batch size, token budget, ...)


@dataclass(eq=False)
class Replica:
    id: str
    url: str
    spec: ReplicaSpec
    client: httpx.AsyncClient     # reaches `url` (a local replica: over its Unix socket)
    outstanding: int = 0          # requests the router has in flight on it
    handle: object = field(default=None, repr=False)  # the backend's own (a process, ...)


class ReplicaFailed(Exception):
    """A replica could not start (or died starting); the message says why, with the
    end of its log."""


class ReplicaBackend(Protocol):
    async def start(self, spec: ReplicaSpec) -> Replica:
        """A new replica of `spec`, once it answers `/health` with 200; ReplicaFailed
        when it cannot get there."""

    def alive(self, replica: Replica) -> bool: ...

    async def stop(self, replica: Replica) -> None:
        """Stop it (gracefully, then by force); its requests in flight end."""

    async def close(self) -> None:
        """Stop every replica this backend started."""
