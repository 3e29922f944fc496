"""`--omp-wait-policy`: how torch's idle OpenMP threads wait, set before torch loads.

libgomp (torch's OpenMP runtime) reads OMP_WAIT_POLICY once, when the library is
loaded by `import torch`; after that it cannot change. By default its workers spin
between parallel ops. In a server they share the cores with the event loop, the
tokenizer thread and, on a shared machine, other processes: a worker spinning while
the thread it waits for is descheduled burns the time that thread needs. Passive
workers sleep at once and are woken (a futex) by the next op.
"""

import logging
import os
import sys

logger = logging.getLogger(__name__)


def apply_omp_wait_policy(policy: str) -> None:
    """Set OMP_WAIT_POLICY for this process's OpenMP runtime ("default": leave it);
    call before importing torch."""
    if policy == "default":
        return
    if "torch" in sys.modules:
        # Too late to take effect: say so rather than pretend.
        logger.warning("--omp-wait-policy %s ignored: torch was imported before it could be set", policy)
        return
    os.environ["OMP_WAIT_POLICY"] = policy.upper()
