"""Our C++ CPU kernels (csrc/), built on first use and cached.

`torch.utils.cpp_extension.load` compiles them with the machine's C++ compiler
into torch's extension cache (TORCH_EXTENSIONS_DIR, by default
~/.cache/torch_extensions) the first time a process needs them, about half a
minute here, then loads the cached build. They are tuned to the CPU that builds
them (-march=native), so the build's name carries a digest of that CPU's
feature flags (and of the sources): a cache shared with another CPU builds its
own copy. Which instructions a kernel uses is thus fixed per set of flags at
build time; `cpu_has` tells Python the same (`--quantization auto` picks the
bfloat16 kernel by it).
"""

import ctypes
import functools
import hashlib
import logging
import os
import platform
import sys
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_SOURCES = [Path(__file__).parent / "csrc" / name for name in ("paged_attention.cpp", "packed_linear.cpp",
                                                                "block_linear.cpp", "bf16_linear.cpp", "amx.cpp",
                                                                "argmax.cpp", "inductor_shims.cpp")]
_HEADERS = [Path(__file__).parent / "csrc" / "panel_queue.h"]


@functools.cache
def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def cpu_has(flag: str) -> bool:
    """Whether this CPU reports `flag` (e.g. avx512_bf16): the kernels, built with
    -march=native, then use it."""
    return flag in _cpu_flags().split()


def cpu_has_amx_bf16() -> bool:
    """Whether this CPU has AMX tiles with bfloat16 dot products (`bf16-amx`)."""
    return cpu_has("amx_tile") and cpu_has("amx_bf16")


@functools.cache
def build_digest() -> str:
    """This CPU's flags and the sources: a build of other sources (another checkout
    sharing the cache) gets its own name instead of rebuilding this one's."""
    digest = hashlib.sha1((platform.machine() + _cpu_flags()).encode())
    for source in _SOURCES + _HEADERS:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:10]


def _sources_at_one_path(digest: str) -> list[str]:
    """The sources, copied into the cache under their digest. torch's build file names
    its sources by absolute path, so two checkouts of the same sources sharing a cache
    (git worktrees, a CI clone) would each rebuild the other's build; from one path
    per digest, they reuse it."""
    from torch.utils.cpp_extension import get_default_build_root

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()) / f"amity_csrc_{digest}"
    root.mkdir(parents=True, exist_ok=True)
    copies = []
    for source in _HEADERS + _SOURCES:  # the headers beside the sources that include them
        copy = root / source.name
        if not copy.exists() or copy.read_bytes() != source.read_bytes():
            temporary = copy.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_bytes(source.read_bytes())
            temporary.replace(copy)  # atomic: a concurrent loader never sees half a file
        if source in _SOURCES:
            copies.append(str(copy))
    return copies


@functools.cache
def load_cpu_kernels() -> None:
    """Registers torch.ops.amity.* (see csrc/); builds them if this CPU has no build yet."""
    from torch.utils.cpp_extension import load

    # torch runs `ninja` from PATH; ours comes with the environment (the `ninja`
    # package), whose bin/ is not on PATH when its python is run directly.
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")
    logger.info("loading amity's CPU kernels (the first start on a machine compiles them)")
    digest = build_digest()
    library = load(name=f"amity_cpu_kernels_{digest}", sources=_sources_at_one_path(digest),
                   extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                   is_python_module=False)
    # torch loads it with its symbols private to it; the graphs inductor compiles call
    # its C entry points (inductor_shims.cpp) by name, resolved when they are loaded.
    ctypes.CDLL(library, mode=os.RTLD_NOW | os.RTLD_GLOBAL | os.RTLD_NOLOAD)

    @torch.library.register_fake("amity::paged_attention")
    def _(q, k, v, k_cache, v_cache, slot_mapping, query_start, context_lens, block_tables, scale, tile_rows=None):
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @torch.library.register_fake("amity::packed_linear")
    def _(x, weight_packed, scale, bias):
        return x.new_empty(x.shape[0], weight_packed.shape[0] * weight_packed.shape[2])

    @torch.library.register_fake("amity::block_linear")
    def _(x, weight_packed, format, bias, tile_rows=None):
        return x.new_empty(x.shape[0], weight_packed.shape[0] * 32)  # panels of 32 outputs

    @torch.library.register_fake("amity::bf16_linear")
    def _(x, weight_packed, bias, tiles=False):
        return x.new_empty(x.shape[0], weight_packed.shape[0] * 32)
