"""Which container serves a catalog model: the seam between serverless and the
replicas. The tool loop (and the serverless routes) ask `base_url(model_id)`; today
the answer comes from `--serverless-model-urls` (containers the operator started);
the dedicated-endpoints controller can plug in here with replicas of its own,
started (or woken) on demand."""

from typing import Protocol


class NoReplica(Exception):
    """No container serves this model, and none can be started."""


class ModelEndpoints(Protocol):
    async def base_url(self, model_id: str) -> str:
        """Base URL (`http://host:port`) of a container serving `model_id`."""


class StaticEndpoints:
    """Containers named on the command line: `ID=URL,ID=URL`."""

    def __init__(self, spec: str | None):
        self.urls: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in (spec or "").split(","))):
            model_id, sep, url = item.partition("=")
            if not sep or not model_id or not url.startswith(("http://", "https://")):
                raise ValueError(f"--serverless-model-urls takes ID=URL items, not {item!r}")
            self.urls[model_id] = url.rstrip("/")

    async def base_url(self, model_id: str) -> str:
        if model_id not in self.urls:
            raise NoReplica(f"no container serves {model_id!r}: name one with "
                            f"--serverless-model-urls {model_id}=http://HOST:PORT")
        return self.urls[model_id]
