"""Where amity keeps what it derives on a machine (converted tokenizers, the packaged
Whisper's assembled files): `$XDG_CACHE_HOME/amity`, else `~/.cache/amity`."""

import os
from pathlib import Path


def amity_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "amity"
