"""Whole sequences packed end to end into one flat batch of tokens.

A pooling model sees every token of each of its sequences in one step (an encoder's
attention is bidirectional: no token can be computed before the last one has
arrived), so a step's input is just the sequences concatenated plus where each one
starts, as cu_seqlens in varlen attention kernels.
"""

from dataclasses import dataclass
from itertools import accumulate, chain

import torch


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # [T] the sequences' tokens, end to end
    positions: torch.Tensor  # [T] each token's position in its own sequence, from 0
    seq_starts: torch.Tensor  # [num_seqs + 1] where each sequence starts in the flat batch; last = T
    seq_lens: list[int]  # the same boundaries on the host, for the per-sequence attention calls

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


def pack(sequences: list[list[int]], device: torch.device | str = "cpu") -> PackedBatch:
    lens = [len(s) for s in sequences]
    if not lens or min(lens) == 0:
        raise ValueError("a packed batch needs at least one sequence and no empty ones")
    starts = torch.tensor([0, *accumulate(lens)], dtype=torch.long)
    lens_t = torch.tensor(lens, dtype=torch.long)
    positions = torch.arange(int(starts[-1])) - torch.repeat_interleave(starts[:-1], lens_t)
    return PackedBatch(
        input_ids=torch.tensor(list(chain.from_iterable(sequences)), dtype=torch.long, device=device),
        positions=positions.to(device), seq_starts=starts.to(device), seq_lens=lens)
