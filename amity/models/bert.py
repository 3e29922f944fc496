"""The BERT encoder family: BERT (MiniLM and the like), RoBERTa / XLM-R, DistilBERT.

One post-LayerNorm encoder; the differences are config switches and names: RoBERTa
and XLM-R count positions from `pad_token_id + 1` (their position table's first rows
belong to padding), DistilBERT has no token-type embeddings and its own parameter
names, which `distilbert_checkpoint_name` maps onto BERT's. Parameter names follow
the Hugging Face checkpoints so weights load by name; q/k/v are one matmul
(`MergedLinear`, filled under the checkpoint's query/key/value names).

The encoder runs on a `PackedBatch` of whole sequences and keeps no KV cache: every
text is a single segment (token type 0), positions restart at each sequence.
"""

import re
from dataclasses import dataclass

import torch
from torch import nn
from transformers.activations import ACT2FN

from amity.models.bidirectional_attention import bidirectional_attention
from amity.models.llama import MergedLinear
from amity.models.packed_batch import PackedBatch


@dataclass(frozen=True)
class EncoderShape:
    """The sizes of an encoder, read from a BERT, RoBERTa, XLM-R or DistilBERT config."""
    vocab_size: int
    hidden_size: int
    num_heads: int
    num_layers: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int  # 0: no token-type embeddings (DistilBERT)
    layer_norm_eps: float
    hidden_act: str

    @classmethod
    def from_config(cls, config) -> "EncoderShape":
        if config.model_type == "distilbert":
            return cls(config.vocab_size, config.dim, config.n_heads, config.n_layers, config.hidden_dim,
                       config.max_position_embeddings, 0, 1e-12, config.activation)
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"position_embedding_type {config.position_embedding_type!r} is not "
                             "supported; only absolute position embeddings are")
        return cls(config.vocab_size, config.hidden_size, config.num_attention_heads,
                   config.num_hidden_layers, config.intermediate_size, config.max_position_embeddings,
                   config.type_vocab_size, config.layer_norm_eps, config.hidden_act)


class BertEmbeddings(nn.Module):
    def __init__(self, shape: EncoderShape):
        super().__init__()
        self.word_embeddings = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.position_embeddings = nn.Embedding(shape.max_positions, shape.hidden_size)
        self.token_type_embeddings = (nn.Embedding(shape.type_vocab_size, shape.hidden_size)
                                      if shape.type_vocab_size else None)
        self.LayerNorm = nn.LayerNorm(shape.hidden_size, eps=shape.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if self.token_type_embeddings is not None:
            # Added before the positions, in transformers' order (float sums round by order).
            x = x + self.token_type_embeddings.weight[0]
        return self.LayerNorm(x + self.position_embeddings(position_ids))


class BertSelfAttention(nn.Module):
    def __init__(self, shape: EncoderShape):
        super().__init__()
        self.num_heads = shape.num_heads
        self.head_dim = shape.hidden_size // shape.num_heads
        self.qkv = MergedLinear(shape.hidden_size, [shape.hidden_size] * 3, ["query", "key", "value"],
                                bias=True)
        self.scale = self.head_dim ** -0.5

    def forward(self, x: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv(x).view(num_tokens, 3, self.num_heads, self.head_dim).unbind(1)
        return bidirectional_attention(q, k, v, seq_lens, self.scale).reshape(num_tokens, -1)


class DenseAddNorm(nn.Module):
    """LayerNorm(dense(h) + residual): how each BERT sub-layer ends (BertSelfOutput, BertOutput)."""

    def __init__(self, in_features: int, shape: EncoderShape):
        super().__init__()
        self.dense = nn.Linear(in_features, shape.hidden_size)
        self.LayerNorm = nn.LayerNorm(shape.hidden_size, eps=shape.layer_norm_eps)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(h) + residual)


class BertAttention(nn.Module):
    def __init__(self, shape: EncoderShape):
        super().__init__()
        self.self = BertSelfAttention(shape)
        self.output = DenseAddNorm(shape.hidden_size, shape)

    def forward(self, x: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
        return self.output(self.self(x, seq_lens), x)


class BertIntermediate(nn.Module):
    def __init__(self, shape: EncoderShape):
        super().__init__()
        self.dense = nn.Linear(shape.hidden_size, shape.intermediate_size)
        self.act = ACT2FN[shape.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(x))


class BertLayer(nn.Module):
    def __init__(self, shape: EncoderShape):
        super().__init__()
        self.attention = BertAttention(shape)
        self.intermediate = BertIntermediate(shape)
        self.output = DenseAddNorm(shape.intermediate_size, shape)

    def forward(self, x: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
        x = self.attention(x, seq_lens)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, shape: EncoderShape):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(shape) for _ in range(shape.num_layers))


class BertPooler(nn.Module):
    """tanh(dense(first token)): BERT's pooled output, which its classifier reads."""

    def __init__(self, shape: EncoderShape):
        super().__init__()
        self.dense = nn.Linear(shape.hidden_size, shape.hidden_size)

    def forward(self, first_token: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(first_token))


class BertModel(nn.Module):
    default_pooling = "cls"  # for a bare encoder directory that names no pooling of its own

    def __init__(self, config, add_pooler: bool = False):
        super().__init__()
        self.config = config
        self.shape = EncoderShape.from_config(config)
        self.embeddings = BertEmbeddings(self.shape)
        self.encoder = BertEncoder(self.shape)
        self.pooler = BertPooler(self.shape) if add_pooler else None

    @staticmethod
    def position_offset(config) -> int:
        """The position-table row of each text's first token."""
        return 0

    @classmethod
    def max_sequence_len(cls, config) -> int:
        return EncoderShape.from_config(config).max_positions - cls.position_offset(config)

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        """[T, hidden] for every token of the packed sequences."""
        x = self.embeddings(batch.input_ids, batch.positions + self.position_offset(self.config))
        for layer in self.encoder.layer:
            x = layer(x, batch.seq_lens)
        return x


class RobertaModel(BertModel):
    """RoBERTa and XLM-R: position p of a text is row pad_token_id + 1 + p of the table.
    (transformers gives a pad token inside a text the padding row; here every token
    of a text is a text token.)"""

    @staticmethod
    def position_offset(config) -> int:
        return config.pad_token_id + 1


# DistilBERT's names for BERT's parameters (applied anywhere in a checkpoint name).
_DISTILBERT_NAMES = [
    (r"\btransformer\.layer\.", "encoder.layer."),
    (r"\.attention\.q_lin\.", ".attention.self.query."),
    (r"\.attention\.k_lin\.", ".attention.self.key."),
    (r"\.attention\.v_lin\.", ".attention.self.value."),
    (r"\.attention\.out_lin\.", ".attention.output.dense."),
    (r"\.sa_layer_norm\.", ".attention.output.LayerNorm."),
    (r"\.ffn\.lin1\.", ".intermediate.dense."),
    (r"\.ffn\.lin2\.", ".output.dense."),
    (r"\.output_layer_norm\.", ".output.LayerNorm."),
]


def distilbert_checkpoint_name(name: str) -> str:
    for pattern, replacement in _DISTILBERT_NAMES:
        name = re.sub(pattern, replacement, name)
    return name


class DistilBertModel(BertModel):
    checkpoint_name = staticmethod(distilbert_checkpoint_name)
