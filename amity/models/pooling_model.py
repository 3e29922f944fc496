"""A pooling model: a network's hidden states over packed sequences, pooled to one
vector per sequence; an embedding model returns the vectors, a classifier its head's
softmax probabilities in label-id order.

The network is any of the encoders (bert.py), the encoder or decoder classifiers
(encoder_classifier.py, decoder_classifier.py) or a sentence-transformer body with
a linear head (`SentenceTransformerClassifier`): each has `hidden_states(batch)`,
and the classifiers `logits(pooled)`.
"""

import torch
from torch import nn

from amity.models.packed_batch import PackedBatch
from amity.models.pooling import Pooling


class SentenceTransformerClassifier(nn.Module):
    """A sentence-transformer body and a linear head on its (pooled) embeddings (setfit_head.py)."""

    def __init__(self, body: nn.Module, head: nn.Linear):
        super().__init__()
        self.body = body
        self.head = head

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        return self.body.hidden_states(batch)

    def logits(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.head(pooled)


class PoolingModel(nn.Module):
    def __init__(self, network: nn.Module, pooling: Pooling, labels: list[str] | None):
        super().__init__()
        self.network = network
        self.pooling = pooling
        self.labels = labels  # label of each class id; None for an embedding model

    @property
    def task(self) -> str:
        return "embed" if self.labels is None else "classify"

    @torch.inference_mode()
    def forward(self, batch: PackedBatch) -> torch.Tensor:
        """float32 [num_seqs, dim] embeddings, or [num_seqs, num_labels] probabilities."""
        hidden = self.network.hidden_states(batch)
        pooled = self.pooling(hidden, batch)
        if self.labels is None:
            return pooled
        return self.network.logits(pooled.to(hidden.dtype)).float().softmax(-1)
