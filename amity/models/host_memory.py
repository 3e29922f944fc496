"""Freed host memory kept for the next step, instead of handed back to the kernel.

A step allocates its activations anew, some of them megabytes (a 1024-token step's
gate/up output is 12.5 MB). glibc's malloc serves such blocks from fresh mmaps, or
returns the heap's free top to the kernel once it passes its trim threshold, and
every page of the next allocation then faults in again, zeroed by the kernel: a
mixed prompt-tiles step spent longer in those faults than in its matmuls
(benchmarks/README.md, session 16). vLLM's CPU backend asks for tcmalloc for the same
reason. Here glibc is told to keep blocks up to its largest mmap threshold on the
heap and to keep the heap's free top.
"""

import ctypes
import functools
import logging

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 32 << 20  # the most glibc accepts on 64-bit
TRIM_THRESHOLD_BYTES = (1 << 31) - 1  # an int: the heap's free top is kept up to 2 GiB


@functools.cache
def keep_freed_memory() -> bool:
    """Once per process; False where the C library is not glibc (nothing changed)."""
    libc = ctypes.CDLL(None)  # the process's own symbols, its C library's among them
    if not hasattr(libc, "gnu_get_libc_version"):  # not glibc
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    kept = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD,
                                                                                 TRIM_THRESHOLD_BYTES))
    if not kept:
        logger.warning("glibc refused amity's malloc thresholds: large freed blocks go back to the kernel")
    return kept
