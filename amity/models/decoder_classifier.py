"""Sequence classifiers on the Llama family's decoder stack: `LlamaForSequenceClassification`,
`MistralForSequenceClassification`, `Qwen2ForSequenceClassification`,
`Qwen3ForSequenceClassification`.

The body is llama.py's `LlamaModel` (the checkpoint's `model.*`), run as any
generation step is (embed, forward over a paged KV cache), and the head is the
checkpoint's `score`, a bias-free linear layer on the last token's hidden state:
the only token that has seen the whole text.
"""

import torch
from torch import nn

from amity.models.attention import AttentionMetadata
from amity.models.llama import LlamaModel
from amity.models.packed_batch import PackedBatch
from amity.models.paged_prefill import prefill_hidden_states


class LlamaForSequenceClassification(nn.Module):
    qkv_bias = False
    qk_norm = False
    default_pooling = "last"

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config, self.qkv_bias or getattr(config, "attention_bias", False),
                                self.qk_norm)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)

    @classmethod
    def max_sequence_len(cls, config) -> int:
        # Sliding-window attention is not implemented: stay inside the window (as the engine does).
        return min(config.max_position_embeddings, getattr(config, "sliding_window", None) or 1 << 30)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, inputs_embeds, positions, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] of an engine step, as LlamaForCausalLM's."""
        return self.model(inputs_embeds, positions, kv_cache, meta)

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        return prefill_hidden_states(self, batch)

    def logits(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.score(pooled)


class Qwen2ForSequenceClassification(LlamaForSequenceClassification):
    qkv_bias = True


class Qwen3ForSequenceClassification(LlamaForSequenceClassification):
    qk_norm = True
