"""`--compile auto`: answer at once with the eager model, compile beside it.

A daemon thread builds the compiled forward and its two graphs on scratch inputs
(compilation.warm_up) while the engine thread keeps stepping the eager model; the
engine takes the compiled forward between two steps once it is ready
(`LLMEngine.step`). Compiled and eager compute the same tokens (tests/models/
test_compilation.py), so the switch changes speed, not results. Dynamo's state is
per thread (its frame hook, tracing context and fake-tensor modes), but torch.fx's
`Tracer.trace`, which AOT autograd and inductor run while compiling, patches
`torch.nn.Module.__call__` for the whole process while it traces: an eager step
calling a module meanwhile went through the tracer and failed ("module is not
installed as a submodule", the requests in flight ended with an error). So while a
compile runs, each trace and each eager step take one lock (`one_at_a_time`): a
step may wait for a trace, never run inside one. What the threads also share is the
CPU: the first compile on a machine (about three minutes for the default model,
mostly inductor's C++ builds in subprocesses) slows the eager steps meanwhile.

And the GIL: torch's ops release it, so an eager step gives it up once an op and
then waits for the compile thread (dynamo's tracing is pure Python) to drop it,
which Python asks for only after the switch interval, 5 ms by default: some 700
ops a step made a warm start's first answer wait seconds. While the compile runs,
the interval is 50 us (`COMPILE_SWITCH_INTERVAL_S`), so a step waits at most that
per op; the compile thread, not the requests, pays for the switches.

A daemon: a shutdown during the compile does not wait for it.
"""

import enum
import functools
import logging
import sys
import threading
import time

import torch

from amity.models.compilation import CompiledForward, warm_up

logger = logging.getLogger("amity.engine")


COMPILE_SWITCH_INTERVAL_S = 5e-5
# Compiles under way in this process (a test may build engines side by side) and the
# interval to give back when the last one ends.
_compiles_lock = threading.Lock()
_compiles_running = 0
_usual_switch_interval_s = sys.getswitchinterval()


def _compile_started() -> None:
    global _compiles_running, _usual_switch_interval_s
    with _compiles_lock:
        if _compiles_running == 0:
            _usual_switch_interval_s = sys.getswitchinterval()
            sys.setswitchinterval(COMPILE_SWITCH_INTERVAL_S)
        _compiles_running += 1


def _compile_ended() -> None:
    global _compiles_running
    with _compiles_lock:
        _compiles_running -= 1
        if _compiles_running == 0:
            sys.setswitchinterval(_usual_switch_interval_s)


# Held by an fx trace (on the compile thread) and by an eager step (on the engine
# thread) while a background compile runs; reentrant, as traces nest.
_TRACE_OR_STEP = threading.RLock()


def _serialize_fx_traces() -> None:
    """Makes every torch.fx trace in this process hold _TRACE_OR_STEP (once)."""
    tracer = torch.fx._symbolic_trace.Tracer
    if getattr(tracer.trace, "amity_serialized", False):
        return
    trace = tracer.trace

    @functools.wraps(trace)
    def serialized(self, *args, **kwargs):
        with _TRACE_OR_STEP:
            return trace(self, *args, **kwargs)

    serialized.amity_serialized = True
    tracer.trace = serialized


def one_at_a_time() -> threading.RLock:
    """What an eager step holds while a background compile runs: no fx trace, which
    patches nn.Module.__call__ process-wide, can be under way meanwhile."""
    return _TRACE_OR_STEP


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
        _serialize_fx_traces()
        _compile_started()
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
        finally:
            _compile_ended()
        self._done.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Whether the compile has ended (ready or failed) within `timeout_s`."""
        return self._done.wait(timeout_s)

    def take(self) -> CompiledForward | None:
        """The compiled forward, once, when it is ready: for the engine thread, between steps."""
        forward, self._ready = self._ready, None
        return forward
