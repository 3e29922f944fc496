"""How a pooling request's hidden states become its output, in the engine.

The runner gathers, in one indexing op per step, the hidden rows of the positions
each pooling request reads (`pooled_positions`): its last prompt token (`last`), its
first (`cls`), or all of them (`mean`). A long prompt may be computed over several
steps, so the engine keeps a request's rows until its prompt is done; then the
requests finishing in a step are pooled together: the mean of each one's rows (for
`last` and `cls` that is the one row itself, exactly), L2-normalised if the model
says so, and for a classifier its head's softmax probabilities in label-id order.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from amity.models.pooling import Pooling, pool


@dataclass
class Pooler:
    pooling: Pooling
    # The classification head (pooled [B, H] -> logits [B, labels]); None: embeddings.
    head: Callable[[torch.Tensor], torch.Tensor] | None = None
    labels: list[str] | None = None  # the label of each class id, with a head

    @property
    def task(self) -> str:
        return "embed" if self.head is None else "classify"

    def pooled_positions(self, num_prompt_tokens: int) -> range:
        method = self.pooling.method
        if method == "last":
            return range(num_prompt_tokens - 1, num_prompt_tokens)
        if method == "cls":
            return range(0, 1)
        return range(0, num_prompt_tokens)

    def __call__(self, rows: torch.Tensor, seq_starts: torch.Tensor) -> torch.Tensor:
        """rows [R, H]: the pooled rows of several requests end to end, request i's at
        seq_starts[i]:seq_starts[i + 1]. Returns float32 [num_requests, dim]."""
        pooled = pool(rows, seq_starts, "mean")
        if self.pooling.normalize:
            pooled = F.normalize(pooled, p=2, dim=-1)
        if self.head is None:
            return pooled
        return self.head(pooled.to(rows.dtype)).float().softmax(-1)
