"""A Llama-family decoder run over whole sequences outside the engine.

The decoder's attention reads and writes a paged KV cache (attention.py). A pooling
request needs no cache after its prompt, so this builds a scratch one just big
enough for the batch, zeroed (padding slots must hold no NaN), lays each sequence
in its own consecutive blocks and runs the model's ordinary step: a causal prefill
of every sequence, which attends only to itself. Inside the engine the same model
runs on the engine's own cache instead; this is the path for running a decoder
pooling model on its own (tests, offline use).
"""

import torch

from amity.models.attention import AttentionMetadata
from amity.models.cpu_kernels import load_cpu_kernels
from amity.models.packed_batch import PackedBatch

SCRATCH_BLOCK_SIZE = 16


def prefill_metadata(batch: PackedBatch, block_size: int) -> tuple[AttentionMetadata, int]:
    """Attention metadata placing sequence s in blocks first_block[s] ..., and how many
    blocks that takes."""
    lens = batch.seq_starts.diff()
    blocks_per_seq = (lens + block_size - 1) // block_size
    first_block = blocks_per_seq.cumsum(0) - blocks_per_seq
    column = torch.arange(int(blocks_per_seq.max()), device=lens.device)
    block_tables = torch.where(column < blocks_per_seq[:, None], first_block[:, None] + column, 0)
    seq_of_token = torch.repeat_interleave(torch.arange(len(lens), device=lens.device), lens)
    slot_mapping = first_block[seq_of_token] * block_size + batch.positions
    meta = AttentionMetadata(slot_mapping=slot_mapping, query_start=batch.seq_starts,
                             context_lens=lens, block_tables=block_tables.contiguous())
    return meta, int(blocks_per_seq.sum())


def prefill_hidden_states(model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    """[T, hidden] of a Llama-family `model` (embed + forward as LlamaForCausalLM's)
    over the packed sequences."""
    device = batch.input_ids.device
    if device.type == "cpu":
        load_cpu_kernels()  # the paged attention kernel
    config = model.config
    num_kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    embeds = model.embed(batch.input_ids)
    meta, num_blocks = prefill_metadata(batch, SCRATCH_BLOCK_SIZE)
    kv_cache = torch.zeros((config.num_hidden_layers, 2, num_blocks, SCRATCH_BLOCK_SIZE, num_kv_heads, head_dim),
                           dtype=embeds.dtype, device=device)
    return model(embeds, batch.positions, kv_cache, meta)
