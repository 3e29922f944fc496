"""W&B artifact resolvers: an artifact version name (`org/registry/name:v0`) to a
local model directory. Pluggable: the real one downloads through `wandb` (it needs
the package, WANDB_API_KEY and the network); the local one reads a directory laid
out `DIR/org/registry/name/v0` (tests, air-gapped mirrors)."""

import re
from pathlib import Path
from typing import Protocol

from amity.suite.endpoints.repos import CannotResolve

ARTIFACT = re.compile(r"(?P<path>[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*){0,3})"
                      r":(?P<version>[A-Za-z0-9._-]{1,64})")
WANDB_ERROR = "WORKLOAD_INIT_HF_WANDB_API_ERROR"


def parse_artifact(name: str) -> tuple[str, str]:
    match = ARTIFACT.fullmatch(name)
    if match is None or ".." in name:
        raise ValueError("an artifact version name looks like `org/registry/name:v0`")
    return match["path"], match["version"]


class ArtifactResolver(Protocol):
    def resolve(self, name: str) -> Path: ...


class LocalArtifacts:
    def __init__(self, root: Path):
        self.root = root

    def resolve(self, name: str) -> Path:
        path, version = parse_artifact(name)
        found = self.root / path / version
        if not found.is_dir():
            raise CannotResolve(f"no W&B artifact {name!r} under {self.root}", WANDB_ERROR)
        return found


class WandbArtifacts:
    def __init__(self, cache: Path):
        self.cache = cache

    def resolve(self, name: str) -> Path:
        path, version = parse_artifact(name)
        try:
            import wandb
        except ImportError:
            raise CannotResolve("W&B artifacts need the `wandb` package (pip install wandb), "
                                "or --wandb-artifact-dir", WANDB_ERROR) from None
        root = self.cache / path / version
        try:
            return Path(wandb.Api().artifact(name).download(root=str(root)))
        except Exception as error:  # wandb raises its own types for auth, network, names
            raise CannotResolve(f"W&B could not provide {name!r}: {error}", WANDB_ERROR) from None
