"""Bidirectional attention over packed sequences: every token of a sequence sees every
token of that sequence and nothing of the others.

One SDPA call per sequence length, not one call over the flat batch with a
block-diagonal mask: the sequences of a length are stacked as SDPA's batch (bucketed),
so each is computed as [heads, len, head_dim] of its own shape with no mask and no
padding, and its numbers do not depend on what it was packed with (SDPA's CPU kernel
blocks its key loop by length, and a masked batch would move those block edges; the
batch dimension is independent work). The loop is over lengths, never tokens.
"""

import torch
import torch.nn.functional as F


def bidirectional_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            seq_lens: list[int], scale: float) -> torch.Tensor:
    """q, k, v: [T, heads, head_dim] of packed sequences of `seq_lens` tokens.
    Returns [T, heads, head_dim]."""
    if len(set(seq_lens)) == 1:  # one bucket: no gather needed
        n, length = len(seq_lens), seq_lens[0]
        q_b, k_b, v_b = (x.view(n, length, *x.shape[1:]).transpose(1, 2) for x in (q, k, v))
        return F.scaled_dot_product_attention(q_b, k_b, v_b, scale=scale).transpose(1, 2).reshape(q.shape)
    out = torch.empty_like(q)
    starts = torch.tensor([0, *seq_lens[:-1]]).cumsum(0).tolist()
    by_length: dict[int, list[int]] = {}
    for start, length in zip(starts, seq_lens):
        by_length.setdefault(length, []).append(start)
    for length, bucket_starts in by_length.items():
        rows = (torch.tensor(bucket_starts)[:, None] + torch.arange(length)).view(-1).to(q.device)
        q_b, k_b, v_b = (x[rows].view(len(bucket_starts), length, *x.shape[1:]).transpose(1, 2)
                         for x in (q, k, v))
        out[rows] = F.scaled_dot_product_attention(q_b, k_b, v_b, scale=scale).transpose(1, 2).reshape(
            -1, *q.shape[1:])
    return out
