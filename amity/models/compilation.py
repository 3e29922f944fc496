"""`--compile`: the decoder stack through `torch.compile` (inductor).

Eager PyTorch pays a dispatch of several microseconds for each of the ~20 small
ops of every layer (norms, rotary, residuals, SiLU): at batch 1 that is most of
a step (benchmarks/README.md). Inductor fuses them into a few C++ loops and
calls the matmuls and our attention op as they are.

One graph serves every step: the number of tokens is dynamic, and the attention
metadata's sizes (how many sequences, how many blocks) are unbacked, since only
the opaque attention op reads them, so a new mix of prefills and decodes does not
recompile. Dynamo still specialises a one-token step, so there are two graphs:
one token, and two or more. `LLMEngine` compiles both at start-up with a short
warm-up generation. Inductor caches what it builds (in /tmp/torchinductor_$USER),
so a later start on the same machine takes seconds.

The embedding and the LM head stay eager: they are one op each.
"""

import torch
from torch._dynamo.decorators import mark_unbacked, maybe_mark_dynamic

from amity.models.attention import AttentionMetadata


class CompiledForward:
    """Wraps a model's `forward(inputs_embeds, positions, kv_caches, meta)`."""

    def __init__(self, forward):
        # Nothing changes a module's attributes after loading, so their guards
        # are only cost: each step would check every parameter again.
        self._compiled = torch.compile(
            forward, dynamic=False, fullgraph=True,
            options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})

    def __call__(self, inputs_embeds, positions, kv_caches, meta: AttentionMetadata):
        # Only the step's token count varies; weights and KV caches are static.
        for tensor in (inputs_embeds, positions, meta.slot_mapping):
            maybe_mark_dynamic(tensor, 0)
        for tensor in (meta.query_start, meta.context_lens, meta.block_tables):
            mark_unbacked(tensor, 0)
        mark_unbacked(meta.block_tables, 1)
        return self._compiled(inputs_embeds, positions, kv_caches, meta)


def compile_model(model: torch.nn.Module) -> torch.nn.Module:
    model.forward = CompiledForward(model.forward)
    return model
