"""`--omp-wait-policy`: how torch's idle OpenMP threads wait, set before torch loads.

libgomp (torch's OpenMP runtime) reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when
the library is loaded by `import torch`; after that they cannot change. Each parallel
op ends in a barrier, and a decode step is about 120 of them (every linear and every
attention call), a few to tens of microseconds apart:

- `bounded` (the default): workers spin `BOUNDED_SPIN_COUNT` times (libgomp counts
  about 100 spins a microsecond: tens of microseconds), then sleep. The gaps inside a
  step are shorter than that, so the step runs as if the workers always spun, and an
  idle server sleeps.
- `passive`: workers sleep at once and each op wakes them (a futex): a wake per op,
  which a single stream pays for about 120 times a step (benchmarks/README.md,
  session 10). It yields the cores soonest, for machines that other work keeps busy.
- `active`: workers always spin, idle or not.
- `default`: libgomp's own (about 3 ms of spinning) or the environment's settings.
"""

import logging
import os
import sys

logger = logging.getLogger(__name__)

BOUNDED_SPIN_COUNT = 3000


def apply_omp_wait_policy(policy: str) -> None:
    """Set this process's OpenMP wait policy ("default": leave it); call before
    importing torch."""
    if policy == "default":
        return
    if "torch" in sys.modules:
        # Too late to take effect: say so rather than pretend.
        logger.warning("--omp-wait-policy %s ignored: torch was imported before it could be set", policy)
        return
    if policy == "bounded":
        os.environ.pop("OMP_WAIT_POLICY", None)
        os.environ["GOMP_SPINCOUNT"] = str(BOUNDED_SPIN_COUNT)
    else:
        os.environ.pop("GOMP_SPINCOUNT", None)
        os.environ["OMP_WAIT_POLICY"] = policy.upper()
