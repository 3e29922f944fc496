"""Calling torch.compile's graphs without going through dynamo's frame on every step.

A call of a compiled function enters dynamo's frame hook: the guards, then the
bytecode dynamo wrote, which walks the model's attribute chains to collect every
parameter and buffer the graph takes (about 190 for the default model) and calls
the graph. The hook and that walk cost about 0.45 ms a call here, a tenth of the
default model's one-stream step (benchmarks/README.md, session 27).

So the backend here is inductor as torch.compile runs it, which also keeps, for each
graph it compiles, where dynamo found each of the graph's inputs (their sources).
A call then checks the guards of each graph itself, newest first (the check dynamo
makes, about 8 us), and calls the first graph whose guards pass: the step's tensors
and their sizes read from the call's arguments, each parameter and buffer from its
module's live `_parameters` / `_buffers` dictionary, so a buffer that a module
replaces (PromptRows' mask when a step outgrows it) is read anew, as dynamo's
bytecode would. When no guard passes, dynamo takes the call (and compiles a graph
for it). A graph whose inputs come from anywhere else, or that returns more than
the one tensor, stays with dynamo.
"""

import logging
from dataclasses import dataclass

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.source import DictGetItemSource

logger = logging.getLogger("amity.engine")


@dataclass
class _Graph:
    sources: list  # where dynamo found each input, in the graph's argument order
    compiled: object  # what inductor returned: called with the inputs, returns the outputs
    num_outputs: int


class RecordingInductor(torch._TorchCompileInductorWrapper):
    """Inductor, configured by `options` as torch.compile(options=...) would; keeps
    each graph it compiles, in order."""

    def __init__(self, options: dict):
        super().__init__(None, options, False)
        self.graphs: list[_Graph] = []

    def __call__(self, model_, inputs_, **kwargs):
        compiled = super().__call__(model_, inputs_, **kwargs)
        sources = [node.meta["grapharg"].source for node in model_.graph.find_nodes(op="placeholder")]
        outputs = model_.graph.output_node().args[0]
        self.graphs.append(_Graph(sources, compiled, len(outputs) if isinstance(outputs, (list, tuple)) else -1))
        return compiled


class _Direct:
    """One graph called with its inputs gathered from a call's locals."""

    def __init__(self, graph: _Graph, guard_manager, module_root: str, f_locals: dict):
        self.guard_manager = guard_manager
        self.compiled = graph.compiled
        containers: list[dict] = []
        expressions = []
        for source in graph.sources:
            name = source.name
            if isinstance(source, DictGetItemSource) and name.startswith(f"L[{module_root!r}]"):
                container = eval(source.base.name, {"L": f_locals})  # noqa: S307 - dynamo's own expression
                if not isinstance(container, dict) or source.index not in container:
                    raise ValueError(f"{name}: not a module's parameter or buffer")
                expressions.append(f"C[{len(containers)}][{source.index!r}]")
                containers.append(container)
            elif name.startswith("L[") and not name.startswith(f"L[{module_root!r}]"):
                expressions.append(name)  # the call's own arguments, their fields and sizes
            else:
                raise ValueError(f"{name}: an input from outside the call")
        self._containers = tuple(containers)
        self._gather = eval(f"lambda L, C: ({', '.join(expressions)},)")  # noqa: S307

    def inputs(self, f_locals: dict) -> tuple:
        return self._gather(f_locals, self._containers)

    def __call__(self, f_locals: dict) -> torch.Tensor:
        return self.compiled(*self.inputs(f_locals))[0]


class GraphCalls:
    """The graphs of one compiled function `code` (compiled with `backend`) that a call
    can reach directly. `module_root` names the local whose modules hold the
    parameters and buffers."""

    def __init__(self, code, backend: RecordingInductor, module_root: str):
        self._code = code
        self._backend = backend
        self._module_root = module_root
        self._adopted = 0  # backend.graphs taken in (adopted or refused)
        self._direct: list[_Direct] = []  # newest first, as dynamo checks them
        self.direct_calls = 0

    def call(self, f_locals: dict):
        """The graph's output if a recorded graph's guards pass, else None."""
        for direct in self._direct:
            if direct.guard_manager.check(f_locals):
                self.direct_calls += 1
                return direct(f_locals)
        return None

    def adopt(self, f_locals: dict, output: torch.Tensor) -> None:
        """After dynamo ran a call: takes in a graph it compiled for that call, checked
        against the call (its guards pass on it, its inputs gather)."""
        if len(self._backend.graphs) == self._adopted:
            return
        new = self._backend.graphs[self._adopted:]
        self._adopted = len(self._backend.graphs)
        entries = _debug_get_cache_entry_list(self._code)
        if len(new) != 1 or len(entries) != len(self._backend.graphs):
            logger.info("compiled graphs stay with dynamo: %d new graphs for %d cache entries", len(new), len(entries))
            return
        graph, guard_manager = new[0], entries[0].guard_manager  # dynamo puts its newest entry first
        try:
            if graph.num_outputs != 1 or not isinstance(output, torch.Tensor):
                raise ValueError(f"{graph.num_outputs} outputs")
            direct = _Direct(graph, guard_manager, self._module_root, f_locals)
            direct.inputs(f_locals)
            if not guard_manager.check(f_locals):
                raise ValueError("its guards fail on the call that compiled it")
        except Exception as e:  # noqa: BLE001 - any surprise leaves the graph with dynamo
            logger.info("a compiled graph stays with dynamo: %s", e)
            return
        self._direct.insert(0, direct)
