"""Pooling: one vector per sequence out of a packed batch's hidden states.

`mean` averages a sequence's tokens, `cls` takes its first token, `last` its last
(a decoder's only token that has seen the whole text). Each is one gather or one
segment sum (`index_add_`) over the whole batch, never a loop over sequences; a
sequence's sum runs over its own tokens in order, so its vector does not depend on
its neighbours. Optional L2 normalisation, as sentence-transformers' `Normalize`.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from amity.models.packed_batch import PackedBatch

POOLING_METHODS = ("mean", "cls", "last")


@dataclass(frozen=True)
class Pooling:
    method: str  # one of POOLING_METHODS
    normalize: bool

    def __post_init__(self):
        if self.method not in POOLING_METHODS:
            raise ValueError(f"pooling {self.method!r} is not one of {POOLING_METHODS}")

    def __call__(self, hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
        """hidden [T, H] -> float32 [num_seqs, H]."""
        pooled = pool(hidden, batch.seq_starts, self.method)
        return F.normalize(pooled, p=2, dim=-1) if self.normalize else pooled


def pool(hidden: torch.Tensor, seq_starts: torch.Tensor, method: str) -> torch.Tensor:
    if method == "cls":
        return hidden[seq_starts[:-1]].float()
    if method == "last":
        return hidden[seq_starts[1:] - 1].float()
    lens = seq_starts.diff()
    seq_of_token = torch.repeat_interleave(torch.arange(len(lens), device=hidden.device), lens)
    sums = hidden.new_zeros(len(lens), hidden.shape[-1], dtype=torch.float32)
    sums.index_add_(0, seq_of_token, hidden.float())
    return sums / lens[:, None]
