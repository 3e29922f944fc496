"""Paged attention.

K/V live in a pool of fixed-size blocks per layer: `[num_blocks, block_size,
num_kv_heads, row]`, in the model's dtype or, for a float32 model, a narrower one
(`--kv-cache-dtype`; by default int8 under integer weights and bfloat16 under bfloat16
ones, dtype.py). A row is head_dim values; an int8 row is followed by a float32 scale
for each 32 of them (`kv_row_elements`). Rounded or quantized once as they are written,
and every read, the new tokens' own included, sees those values. An engine keeps every
layer's pair in one tensor,
`[num_layers, 2, num_blocks, block_size, num_kv_heads, row]` (`kv_cache[layer][0]`
is that layer's K pool, a contiguous view), so a step passes the model one tensor.
Each sequence names its blocks in a block table, so a token at position p sits in
block `block_table[p // block_size]`, slot `p % block_size`. Every step writes the
new tokens' K/V to their slots, then attends over each sequence's whole context.

One rule for every sequence in a step, whether it is prefilling, decoding or
continuing a chunked prefill: query token i of a chunk of q_len tokens, with
context_len tokens in context after this step, sees keys 0 .. context_len - q_len + i.

On the CPU the work is our C++ kernel (csrc/paged_attention.cpp), which reads
K/V in place through the block tables and computes each query row alone, so how
a prompt is chunked or cached never changes a row's bits. Under `--prompt-tiles`
its prompt rows (`tile_rows`) go on AMX tiles with bfloat16 products where the
cache is bfloat16, its generated rows on float32 loops. On other devices it is
plain PyTorch (`reference_paged_attention`), which gathers each context and runs
SDPA: decodes as one padded batch, longer chunks one sequence at a time. The
tests hold both to the definition.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] flat slot index of each new token
    query_start: torch.Tensor  # [num_seqs + 1] where each sequence's tokens start in the flat batch
    context_lens: torch.Tensor  # [num_seqs] cached + new tokens after this step
    block_tables: torch.Tensor  # [num_seqs, most blocks of any sequence], padded with block 0


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float,
                    tile_rows: torch.Tensor | None = None) -> torch.Tensor:
    """q: [T, num_heads, head_dim]; k, v: [T, num_kv_heads, head_dim] for the new
    tokens, written to the cache first. Returns [T, num_heads, head_dim].
    `tile_rows` (bool [>= T], models/prompt_rows.py): the rows the CPU kernel computes
    on AMX tiles where the cache is bfloat16; the rest, and every other device, as
    without it."""
    if q.device.type == "cpu":
        return torch.ops.amity.paged_attention(q, k, v, k_cache, v_cache, meta.slot_mapping,
                                               meta.query_start, meta.context_lens,
                                               meta.block_tables, scale, tile_rows)
    return reference_paged_attention(q, k, v, k_cache, v_cache, meta, scale)


def _context_slots(block_table: torch.Tensor, context_len: int, block_size: int) -> torch.Tensor:
    slots = block_table[:, None] * block_size + torch.arange(block_size, device=block_table.device)
    return slots.reshape(-1)[:context_len]


KV_GROUP = 32  # int8 values per scale (csrc/paged_attention.cpp's kGroup), as llama.cpp's q8_0


def kv_row_elements(head_dim: int, cache_dtype: torch.dtype) -> int:
    """A head's K or V row in a cache of `cache_dtype`: its head_dim values, and in an
    int8 cache a float32 scale (4 bytes) for each group of KV_GROUP of them after them."""
    return head_dim + 4 * -(-head_dim // KV_GROUP) if cache_dtype == torch.int8 else head_dim


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """float32 [..., head_dim] -> int8 rows [..., kv_row_elements]: each group of
    KV_GROUP values round(x / scale) with scale = the group's largest magnitude / 127,
    then the scales' bytes (the kernel's quantize_row; a group of zeros has scale 0,
    a group with a NaN zeros)."""
    head_dim = x.shape[-1]
    num_groups = -(-head_dim // KV_GROUP)
    # A short last group padded with zeros, which change no group's largest magnitude.
    groups = F.pad(x, (0, num_groups * KV_GROUP - head_dim)).unflatten(-1, (num_groups, KV_GROUP))
    scales = groups.abs().amax(-1, keepdim=True) / 127
    units = torch.round(groups / scales)
    units = torch.where((scales > 0) & (units.abs() <= 127), units, 0).flatten(-2)[..., :head_dim]
    return torch.cat([units.to(torch.int8), scales.squeeze(-1).contiguous().view(torch.int8)], -1)


def dequantize_rows(rows: torch.Tensor, head_dim: int) -> torch.Tensor:
    """int8 rows [..., kv_row_elements] -> float32 [..., head_dim]: values times their group's scale."""
    scales = rows[..., head_dim:].contiguous().view(torch.float32)
    return rows[..., :head_dim].float() * scales.repeat_interleave(KV_GROUP, -1)[..., :head_dim]


def as_cached(x: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """New K or V [..., head_dim] as a cache of `cache_dtype` keeps them."""
    return quantize_rows(x.float()) if cache_dtype == torch.int8 else x.to(cache_dtype)


def widened(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Cached rows as `like` (the queries) computes with them."""
    return (dequantize_rows(rows, like.shape[-1]) if rows.dtype == torch.int8 else rows).to(like.dtype)


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """slots [...] -> K or V rows [..., num_kv_heads, row elements]."""
    num_kv_heads, row = cache.shape[-2:]
    flat = cache.view(-1, num_kv_heads, row).index_select(0, slots.reshape(-1))
    return flat.view(*slots.shape, num_kv_heads, row)


def reference_paged_attention(q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float):
    num_kv_heads, row = k_cache.shape[-2:]
    block_size = k_cache.shape[1]
    # The new K/V as the cache keeps them, for every use below (as the kernel does).
    k_rows, v_rows = as_cached(k, k_cache.dtype), as_cached(v, v_cache.dtype)
    k_cache.view(-1, num_kv_heads, row).index_copy_(0, meta.slot_mapping, k_rows)
    v_cache.view(-1, num_kv_heads, row).index_copy_(0, meta.slot_mapping, v_rows)
    k, v = widened(k_rows, q), widened(v_rows, q)
    out = torch.empty_like(q)
    starts = meta.query_start.tolist()
    context_lens = meta.context_lens.tolist()
    decodes = []
    for s, ctx_len in enumerate(context_lens):
        start, q_len = starts[s], starts[s + 1] - starts[s]
        if q_len == 1:
            decodes.append(s)
            continue
        q_i = q[start:start + q_len].transpose(0, 1).unsqueeze(0)
        if ctx_len == q_len:
            # Nothing cached before this chunk: its own K/V are the whole context.
            k_i, v_i = k[start:start + q_len], v[start:start + q_len]
            mask, causal = None, True
        else:
            slots = _context_slots(meta.block_tables[s], ctx_len, block_size)
            k_i, v_i = widened(_gather(k_cache, slots), q), widened(_gather(v_cache, slots), q)
            q_pos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)
            mask = torch.arange(ctx_len, device=q.device)[None, :] <= q_pos[:, None]
            causal = False
        o = F.scaled_dot_product_attention(
            q_i, k_i.transpose(0, 1).unsqueeze(0), v_i.transpose(0, 1).unsqueeze(0),
            attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
        out[start:start + q_len] = o.squeeze(0).transpose(0, 1)
    if decodes:
        # Padded to the longest context; padding reads slots other sequences own
        # or no sequence has written. Their scores are masked, and their values
        # zeroed too: a weight of 0 times a NaN left there would still be NaN.
        longest = max(context_lens[s] for s in decodes)
        rows = torch.tensor(decodes, device=q.device)
        slots = torch.stack([_context_slots(meta.block_tables[s], longest, block_size) for s in decodes])
        key_mask = torch.arange(longest, device=q.device)[None, :] < meta.context_lens[rows][:, None]
        idx = meta.query_start[rows]
        q_d = q[idx].unsqueeze(2)  # [B, H, 1, D]
        kept = key_mask[:, :, None, None]  # [B, L, 1, 1]
        k_d = widened(_gather(k_cache, slots), q).where(kept, 0).transpose(1, 2)  # [B, Hkv, L, D]
        v_d = widened(_gather(v_cache, slots), q).where(kept, 0).transpose(1, 2)
        o = F.scaled_dot_product_attention(q_d, k_d, v_d, attn_mask=key_mask[:, None, None, :],
                                           scale=scale, enable_gqa=True)
        out[idx] = o.squeeze(2)
    return out
