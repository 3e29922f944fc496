"""Paged attention in plain PyTorch.

K/V live in a pool of fixed-size blocks per layer: `[num_blocks, block_size,
num_kv_heads, head_dim]`. Each sequence names its blocks in a block table, so a
token at position p sits in block `block_table[p // block_size]`, slot
`p % block_size`. Every step writes the new tokens' K/V to their slots, then reads
each sequence's whole context back through its block table.

Decodes (one query token per sequence) run as one padded batch; prefill chunks run
one sequence at a time, since their query lengths differ and padding them together
would waste compute on the longest.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] flat slot index of each new token
    # Prefill chunks: one entry per sequence with more than one query token.
    prefill_query_starts: list[int]
    prefill_query_lens: list[int]
    prefill_context_lens: list[int]  # cached + new tokens after this step
    prefill_context_slots: list[torch.Tensor]  # per sequence, [context_len] slots of its K/V
    # Decodes: sequences with exactly one query token, batched.
    decode_token_indices: torch.Tensor  # [num_decodes] where their tokens sit in the flat batch
    decode_context_slots: torch.Tensor  # [num_decodes, longest context], padded with slot 0
    decode_key_mask: torch.Tensor  # [num_decodes, 1, 1, longest context] True = attend

    @property
    def num_decodes(self) -> int:
        return self.decode_token_indices.numel()


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    num_kv_heads, head_dim = k_cache.shape[-2:]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, v)


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """slots [...] -> K or V [..., num_kv_heads, head_dim]. The slots of a step are
    computed once (model_runner.py); each layer only gathers its own cache."""
    num_kv_heads, head_dim = cache.shape[-2:]
    flat = cache.view(-1, num_kv_heads, head_dim).index_select(0, slots.reshape(-1))
    return flat.view(*slots.shape, num_kv_heads, head_dim)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """q: [T, num_heads, head_dim]; k, v: [T, num_kv_heads, head_dim] for the new tokens.

    Returns [T, num_heads, head_dim].
    """
    write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
    out = torch.empty_like(q)
    for start, q_len, ctx_len, slots in zip(meta.prefill_query_starts, meta.prefill_query_lens,
                                            meta.prefill_context_lens, meta.prefill_context_slots):
        q_i = q[start:start + q_len].transpose(0, 1).unsqueeze(0)
        if ctx_len == q_len:
            # Nothing cached before this chunk: its own K/V are the whole context.
            k_i, v_i = k[start:start + q_len], v[start:start + q_len]
            mask, causal = None, True
        else:
            k_i, v_i = _gather(k_cache, slots), _gather(v_cache, slots)
            # Query i sits at position ctx_len - q_len + i and sees keys up to it.
            q_pos = torch.arange(ctx_len - q_len, ctx_len, device=q.device)
            mask = torch.arange(ctx_len, device=q.device)[None, :] <= q_pos[:, None]
            causal = False
        o = F.scaled_dot_product_attention(
            q_i, k_i.transpose(0, 1).unsqueeze(0), v_i.transpose(0, 1).unsqueeze(0),
            attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
        out[start:start + q_len] = o.squeeze(0).transpose(0, 1)
    if meta.num_decodes:
        idx = meta.decode_token_indices
        q_d = q[idx].unsqueeze(2)  # [B, H, 1, D]
        k_d = _gather(k_cache, meta.decode_context_slots).transpose(1, 2)  # [B, Hkv, L, D]
        v_d = _gather(v_cache, meta.decode_context_slots).transpose(1, 2)
        o = F.scaled_dot_product_attention(q_d, k_d, v_d, attn_mask=meta.decode_key_mask,
                                           scale=scale, enable_gqa=True)
        out[idx] = o.squeeze(2)
    return out
