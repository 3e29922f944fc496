"""`--compile`: the decoder stack through `torch.compile` (inductor).

Eager PyTorch pays a dispatch of several microseconds for each of the ~20 small
ops of every layer (norms, rotary, residuals, SiLU): at batch 1 that is most of
a step (benchmarks/README.md). Inductor fuses them into a few C++ loops and
calls the matmuls and our attention op as they are.

On the CPU the code that calls them is C++ too (inductor's `cpp_wrapper`): its
Python wrapper makes about 40 calls a layer (kernels, ops, buffer views, size
checks), some 1.3 ms of a 15-17 ms bfloat16 decode step here, in an A/B in one
process. Its price is the first compile on a machine (below).

One graph serves every step: the number of tokens is dynamic, and the attention
metadata's sizes (how many sequences, how many blocks) are unbacked, since only
the opaque attention op reads them, so a new mix of prefills and decodes does not
recompile. Dynamo still specialises a one-token step, so there are two graphs:
one token, and two or more. `warm_up` builds both on scratch inputs, before
serving (`--compile true`) or in a thread beside the live steps (`auto`,
engine/background_compile.py). Inductor caches what it builds (in
/tmp/torchinductor_$USER), so a later start on the same machine is faster: about
20 s here, against about three minutes cold for the default model (80 s without
cpp_wrapper).

The KV cache comes in as one tensor (every layer's K and V, attention.py), not as
2 x num_layers: dynamo guards one tensor instead of 60 for the default model (277
lines of `TORCH_LOGS=guards` for the two graphs, against 1521), and the graph's
call passes one handle. Each layer's attention writes its views of it in place
(inductor re-inplaces the op's mutation; inductor_storage_offset.py keeps their
offsets). The guards left are on the step's six tensors (dtype, device, sizes,
dynamic marks, no aliasing), the global grad/autocast state and the model's code:
about 8 us a step to check; each stands for a real change that needs another graph,
so none is filtered.

A step calls the graph that its guards admit itself (graph_call.py), not through
dynamo's frame and the bytecode dynamo wrote, which collects the model's ~190
parameters and buffers attribute by attribute on every call: 0.4-0.7 ms a step.
Dynamo takes a call that no graph's guards admit, and compiles for it.

The embedding and the LM head stay eager: they are one op each.

The graph's C++ calls our ops through their C entry points (csrc/inductor_shims.cpp,
declared below), not through the dispatcher, which looks each op up by name and
boxes its arguments on every call.

Inductor keys what it caches by the graph's code, not by the schemas of the ops the
graph calls: an artifact built against another build of our kernels (an op that
gained an argument) calls them as that build did, and crashed the process. So each
build of the kernels (cpu_kernels.build_digest) has its own cache directory inside
inductor's.
"""

import itertools
import logging
import os
import types

import torch
from torch._dynamo.decorators import mark_unbacked, maybe_mark_dynamic

from amity.models.attention import AttentionMetadata
from amity.models.cpu_kernels import build_digest, load_cpu_kernels
from amity.models.graph_call import GraphCalls, RecordingInductor
from amity.models.inductor_storage_offset import register_sym_storage_offset_lowering

logger = logging.getLogger("amity.engine")
_model_keys = itertools.count()


def _cache_for_these_kernels() -> None:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    leaf = f"amity-kernels-{build_digest()}"
    current = cache_dir()  # TORCHINDUCTOR_CACHE_DIR or inductor's default, made absolute
    if os.path.basename(current) != leaf:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(current, leaf)


# inductor_shims.cpp's entry points take each op's arguments in schema order, as
# inductor passes them: a tensor as a handle, an optional one as a pointer to a
# handle, int, float and bool as these; then a pointer for the result's handle.
_C_TYPES = {"Tensor": "AtenTensorHandle", "Optional[Tensor]": "AtenTensorHandle*", "int": "int64_t",
            "float": "double", "bool": "int32_t"}
_SHIMS = ("block_linear", "bf16_linear", "packed_linear", "paged_attention")


class _ShimKey:
    """A key of inductor's custom_ops_to_c_shims: equal to (and hashed as) its op, which
    inductor looks up, but pickled as its name. Inductor pickles its config into the
    key of what it caches on disk, and an op itself does not pickle: it would turn
    that cache off."""

    def __init__(self, name: str):
        self.name = name
        self.op = getattr(torch.ops.amity, name).default

    def __hash__(self):
        return hash(self.op)

    def __eq__(self, other):
        return other is self.op or isinstance(other, _ShimKey) and other.name == self.name

    def __reduce__(self):
        return _ShimKey, (self.name,)


def _shim_declaration(key: _ShimKey) -> str:
    args = [f"{_C_TYPES[str(a.type)]} {a.name}" for a in key.op._schema.arguments]
    return f"AOTITorchError aoti_torch_cpu_{key.name}({', '.join(args)}, AtenTensorHandle* out)"


def _shim_declarations() -> dict:
    load_cpu_kernels()
    return {key: [_shim_declaration(key)] for key in map(_ShimKey, _SHIMS)}


def _forward(forward, inputs_embeds, positions, kv_cache, meta):
    return forward(inputs_embeds, positions, kv_cache, meta)


class CompiledForward:
    """Wraps a model's `forward(inputs_embeds, positions, kv_cache, meta)`."""

    def __init__(self, forward, device: torch.device):
        # Nothing changes a module's attributes after loading, so guards on them
        # would only cost time: each step would check every parameter again. But
        # dynamo keeps its graphs per code object, and without those guards a
        # second model in the process (another engine, a test) would run the first
        # one's graphs on its own modules. So each model compiles its own copy of
        # `_forward`'s code object.
        code = _forward.__code__.replace(co_name=f"amity_forward_{next(_model_keys)}")
        register_sym_storage_offset_lowering()  # the KV cache's per-layer views need it
        _cache_for_these_kernels()
        self._forward = forward
        self._marked_cache = None
        options = {}
        if device.type == "cpu":
            options = {"cpp_wrapper": True, "aot_inductor.custom_ops_to_c_shims": _shim_declarations()}
        backend = RecordingInductor(options)
        function = types.FunctionType(code, _forward.__globals__)
        self._graphs = GraphCalls(code, backend, module_root="forward")
        self._compiled = torch._dynamo.optimize(backend=backend, nopython=True, dynamic=False,
                                                guard_filter_fn=torch.compiler.skip_guard_on_all_nn_modules_unsafe)(function)

    def __call__(self, inputs_embeds, positions, kv_cache: torch.Tensor, meta: AttentionMetadata):
        f_locals = {"forward": self._forward, "inputs_embeds": inputs_embeds, "positions": positions,
                    "kv_cache": kv_cache, "meta": meta}
        output = self._graphs.call(f_locals)
        if output is not None:
            return output
        # The KV cache's block count is dynamic, so that the graphs cached on disk
        # serve a restart whose free memory, and so whose cache size, differs. The
        # engine keeps one cache tensor, and the mark stays on it: once.
        if kv_cache is not self._marked_cache:
            maybe_mark_dynamic(kv_cache, 2)
            self._marked_cache = kv_cache
        # Only the step's token count varies from step to step.
        for tensor in (inputs_embeds, positions, meta.slot_mapping):
            maybe_mark_dynamic(tensor, 0)
        for tensor in (meta.query_start, meta.context_lens, meta.block_tables):
            mark_unbacked(tensor, 0)
        mark_unbacked(meta.block_tables, 1)
        output = self._compiled(self._forward, inputs_embeds, positions, kv_cache, meta)
        self._graphs.adopt(f_locals, output)
        return output


def warm_up(forward: CompiledForward, model: torch.nn.Module, kv_cache: torch.Tensor) -> None:
    """Builds both graphs: a step of three tokens, then one of a single token, as one
    sequence's prefill and decode. They write a scratch KV cache of four blocks shaped
    like `kv_cache` (the block count is dynamic), so a warm-up beside live steps never
    touches a live block; with LoRA they read the step's adapter buffer as it is and
    never write it. Four tokens of ids 0-3: any model's vocabulary has them."""
    num_layers, pair, _, *block_shape = kv_cache.shape
    scratch = torch.zeros((num_layers, pair, 4, *block_shape), dtype=kv_cache.dtype, device=kv_cache.device)
    as_long = {"dtype": torch.long, "device": kv_cache.device}
    with torch.inference_mode():  # as ModelRunner.execute: dynamo guards on it
        for graph, positions in enumerate((range(3), range(3, 4)), 1):
            logger.info("compiling graph %d of 2 (%s)", graph,
                        "steps of two or more tokens" if len(positions) > 1 else "one-token steps")
            ids = torch.tensor(positions, **as_long)
            meta = AttentionMetadata(slot_mapping=ids.clone(),
                                     query_start=torch.tensor([0, len(positions)], **as_long),
                                     context_lens=torch.tensor([positions.stop], **as_long),
                                     block_tables=torch.zeros((1, 1), **as_long))
            forward(model.embed(ids), ids.clone(), scratch, meta)
