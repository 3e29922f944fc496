"""`--compile auto`: answer at once with the eager model, compile beside it.

A daemon thread builds the compiled forward and its two graphs on scratch inputs
(compilation.warm_up) while the engine thread keeps stepping the eager model; the
engine takes the compiled forward between two steps once it is ready
(`LLMEngine.step`). Compiled and eager compute the same tokens (tests/models/
test_compilation.py), so the switch changes speed, not results. Dynamo's state is
per thread (its frame hook, tracing context and fake-tensor modes), so tracing here
does not reach the eager steps; what the two threads share is the CPU: the first
compile on a machine (about three minutes for the default model, mostly inductor's
C++ builds in subprocesses) slows the eager steps meanwhile.

A daemon: a shutdown during the compile does not wait for it.
"""

import enum
import logging
import threading
import time

import torch

from amity.models.compilation import CompiledForward, warm_up

logger = logging.getLogger("amity.engine")


class CompileState(enum.IntEnum):
    """The `amity_compile_state` gauge."""
    EAGER = 0  # not compiling: --compile false, a model that does not generate, or not started
    COMPILING = 1  # serving eagerly while the graphs build
    COMPILED = 2  # steps run the compiled graphs
    FAILED = 3  # the compile raised (logged): serving stays eager


class BackgroundCompile:
    def __init__(self, model: torch.nn.Module, kv_cache: torch.Tensor):
        self.failed = False
        self._ready: CompiledForward | None = None
        self._done = threading.Event()
        logger.info("compiling the model in the background (--compile auto); serving the "
                    "eager model meanwhile (the first compile on a machine takes minutes)")
        self._thread = threading.Thread(target=self._compile, args=(model, kv_cache),
                                        name="amity-compile", daemon=True)
        self._thread.start()

    def _compile(self, model, kv_cache) -> None:
        started = time.perf_counter()
        try:
            forward = CompiledForward(model.forward, kv_cache.device)
            warm_up(forward, model, kv_cache)
        except Exception:  # no C++ compiler, an inductor bug: eager still serves
            logger.exception("the background compile failed; serving stays eager")
            self.failed = True
        else:
            logger.info("compiled in %.1f s in the background; the next step runs the compiled "
                        "graphs", time.perf_counter() - started)
            self._ready = forward
        self._done.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Whether the compile has ended (ready or failed) within `timeout_s`."""
        return self._done.wait(timeout_s)

    def take(self) -> CompiledForward | None:
        """The compiled forward, once, when it is ready: for the engine thread, between steps."""
        forward, self._ready = self._ready, None
        return forward
