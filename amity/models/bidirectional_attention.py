"""Bidirectional attention over packed sequences: every token of a sequence sees every
token of that sequence and nothing of the others.

One SDPA call per sequence, on that sequence's own [heads, len, head_dim] tensors,
not one call over the flat batch with a block-diagonal mask: a sequence's numbers
then come from a computation of its own shape only, so they do not depend on what
it was packed with (SDPA's CPU kernel blocks its key loop by length, and a masked
batch would move those block edges). The loop is over sequences, never tokens.
"""

import torch
import torch.nn.functional as F


def bidirectional_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            seq_lens: list[int], scale: float) -> torch.Tensor:
    """q, k, v: [T, heads, head_dim] of packed sequences of `seq_lens` tokens.
    Returns [T, heads, head_dim]."""
    outputs = []
    for q_s, k_s, v_s in zip(q.split(seq_lens), k.split(seq_lens), v.split(seq_lens)):
        out = F.scaled_dot_product_attention(q_s.transpose(0, 1), k_s.transpose(0, 1),
                                             v_s.transpose(0, 1), scale=scale)
        outputs.append(out.transpose(0, 1))
    return torch.cat(outputs)
