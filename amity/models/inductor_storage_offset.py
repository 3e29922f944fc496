"""A lowering torch 2.13's inductor lacks: `aten.sym_storage_offset`.

The compiled forward passes the whole KV cache as one tensor, and each layer's
attention writes its K and V pools: views at offsets `(2 * layer + kv) *
num_blocks * block_elems`, symbolic since the block count is dynamic. Inductor's
re-inplacing rebuilds such a mutated view as `as_strided(base, size, stride,
sym_storage_offset(view))`, and without a lowering that offset is recomputed on a
tensor rebuilt without its offset: 0. Every layer then writes layer 0's K pool,
silently (pytorch/pytorch#198068; the fix proposed upstream, #198069, is this
lowering). Its siblings sym_size and sym_stride read the traced value the same way.
"""

import functools

import torch


@functools.cache
def register_sym_storage_offset_lowering() -> None:
    from torch._inductor.lowering import lowerings, register_lowering
    from torch._inductor.virtualized import V

    op = torch.ops.aten.sym_storage_offset.default
    if op in lowerings:  # a torch that has it
        return

    @register_lowering(op)
    def sym_storage_offset(tensor):
        value = V.graph.current_node.meta["val"]
        return value.node.expr if isinstance(value, torch.SymInt) else int(value)
