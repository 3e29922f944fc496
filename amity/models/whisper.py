"""Whisper (encoder-decoder speech recognition) as a plain nn.Module.

Parameter names are `transformers`' WhisperForConditionalGeneration's without the
leading `model.` (the LM head is tied to `decoder.embed_tokens`), so an HF state dict
loads as it is. The encoder runs once per 30-second window of log-mel features. The
decoder runs in the engine's flat batches: its self-attention K/V live in the paged
KV cache (attention.py), and its cross-attention reads each sequence's own encoder
K/V, computed once per window by `cross_kv`.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from amity.models.attention import AttentionMetadata, paged_attention


@dataclass(frozen=True)
class WhisperDims:
    num_mel_bins: int
    d_model: int
    encoder_layers: int
    encoder_heads: int
    decoder_layers: int
    decoder_heads: int
    ffn_dim: int
    vocab_size: int
    max_source_positions: int = 1500
    max_target_positions: int = 448


# Per layer: (K, V), each [heads, source positions, head_dim].
CrossKV = list[tuple[torch.Tensor, torch.Tensor]]


class WhisperAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)  # Whisper's keys have no bias
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def heads(self, x: torch.Tensor) -> torch.Tensor:
        """[..., T, d_model] -> [..., T, heads, head_dim]"""
        return x.unflatten(-1, (self.num_heads, self.head_dim))


class WhisperEncoderLayer(nn.Module):
    def __init__(self, dims: WhisperDims):
        super().__init__()
        self.self_attn = WhisperAttention(dims.d_model, dims.encoder_heads)
        self.self_attn_layer_norm = nn.LayerNorm(dims.d_model)
        self.fc1 = nn.Linear(dims.d_model, dims.ffn_dim)
        self.fc2 = nn.Linear(dims.ffn_dim, dims.d_model)
        self.final_layer_norm = nn.LayerNorm(dims.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, d]
        attn = self.self_attn
        h = self.self_attn_layer_norm(x)
        q, k, v = (attn.heads(p(h)).transpose(1, 2) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        # Attention in float32 even under bfloat16 autocast (whisper_compute.py): as fast
        # on a CPU (torch's flash attention gains nothing from bfloat16 there), and in
        # bfloat16 base mis-heard a German test clip's last words.
        with torch.autocast(x.device.type, enabled=False):
            o = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
        x = x + attn.out_proj(o.transpose(1, 2).flatten(2))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class WhisperEncoder(nn.Module):
    def __init__(self, dims: WhisperDims):
        super().__init__()
        self.conv1 = nn.Conv1d(dims.num_mel_bins, dims.d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(dims.d_model, dims.d_model, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(dims.max_source_positions, dims.d_model)
        self.layers = nn.ModuleList(WhisperEncoderLayer(dims) for _ in range(dims.encoder_layers))
        self.layer_norm = nn.LayerNorm(dims.d_model)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [B, mel bins, 3000] -> [B, 1500, d_model]"""
        x = F.gelu(self.conv2(F.gelu(self.conv1(features)))).transpose(1, 2)
        x = x + self.embed_positions.weight[:x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class WhisperDecoderLayer(nn.Module):
    def __init__(self, dims: WhisperDims):
        super().__init__()
        self.self_attn = WhisperAttention(dims.d_model, dims.decoder_heads)
        self.self_attn_layer_norm = nn.LayerNorm(dims.d_model)
        self.encoder_attn = WhisperAttention(dims.d_model, dims.decoder_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(dims.d_model)
        self.fc1 = nn.Linear(dims.d_model, dims.ffn_dim)
        self.fc2 = nn.Linear(dims.ffn_dim, dims.d_model)
        self.final_layer_norm = nn.LayerNorm(dims.d_model)

    def forward(self, x: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor],
                meta: AttentionMetadata, cross: list[tuple[torch.Tensor, torch.Tensor]],
                query_starts: list[int]) -> torch.Tensor:
        """x [T, d]: the step's tokens of every sequence, flat; `cross[s]` is sequence
        s's encoder (K, V) for this layer."""
        attn = self.self_attn
        h = self.self_attn_layer_norm(x)
        q, k, v = (attn.heads(p(h)) for p in (attn.q_proj, attn.k_proj, attn.v_proj))
        o = paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, attn.head_dim ** -0.5)
        x = x + attn.out_proj(o.flatten(1))

        attn = self.encoder_attn
        q = attn.heads(attn.q_proj(self.encoder_attn_layer_norm(x))).transpose(0, 1)  # [H, T, D]
        q = q * attn.head_dim ** -0.5
        # Each sequence attends to its own audio: one small attention per sequence,
        # written out because SDPA on these 3-D shapes takes its math path, which
        # scales a copy of the 1500-position K at every step (measured: 1.4x slower).
        o = torch.cat([torch.softmax(q[:, a:b] @ k_s.transpose(1, 2), dim=-1) @ v_s
                       for (k_s, v_s), a, b in zip(cross, query_starts, query_starts[1:])], dim=1)
        x = x + attn.out_proj(o.transpose(0, 1).flatten(1))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class WhisperDecoder(nn.Module):
    def __init__(self, dims: WhisperDims):
        super().__init__()
        self.embed_tokens = nn.Embedding(dims.vocab_size, dims.d_model)
        self.embed_positions = nn.Embedding(dims.max_target_positions, dims.d_model)
        self.layers = nn.ModuleList(WhisperDecoderLayer(dims) for _ in range(dims.decoder_layers))
        self.layer_norm = nn.LayerNorm(dims.d_model)


class Whisper(nn.Module):
    def __init__(self, dims: WhisperDims):
        super().__init__()
        self.dims = dims
        self.encoder = WhisperEncoder(dims)
        self.decoder = WhisperDecoder(dims)
        # Set by whisper_compute.prepare_whisper: its precision, our CPU kernel for the LM
        # head, and the dtype the encoder and cross K/V projections autocast to (None: none).
        self.compute_precision: str | None = None
        self.lm_head: nn.Module | None = None
        self.encoder_autocast: torch.dtype | None = None

    def encode(self, features: torch.Tensor) -> torch.Tensor:
        with self._autocast(features):
            return self.encoder(features).to(features.dtype)

    def cross_kv(self, encoder_out: torch.Tensor) -> CrossKV:
        """One window's encoder output [1500, d] -> each decoder layer's (K, V), kept
        in the model's dtype whatever the projections computed in."""
        out = []
        with self._autocast(encoder_out):
            for layer in self.decoder.layers:
                attn = layer.encoder_attn
                out.append(tuple(attn.heads(p(encoder_out)).transpose(0, 1).to(encoder_out.dtype).contiguous()
                                 for p in (attn.k_proj, attn.v_proj)))
        return out

    def _autocast(self, x: torch.Tensor):
        return torch.autocast(x.device.type, dtype=self.encoder_autocast or torch.bfloat16,
                              enabled=self.encoder_autocast is not None)

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor,
               kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
               cross: list[CrossKV], query_starts: list[int]) -> torch.Tensor:
        """The hidden states [T, d] of a flat batch of decoder tokens; sequence s owns
        tokens query_starts[s] .. query_starts[s + 1] and attends to `cross[s]`."""
        dec = self.decoder
        x = dec.embed_tokens(input_ids) + dec.embed_positions(positions)
        for i, layer in enumerate(dec.layers):
            x = layer(x, kv_caches[i], meta, [c[i] for c in cross], query_starts)
        return dec.layer_norm(x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is not None:
            return self.lm_head(hidden)
        return hidden @ self.decoder.embed_tokens.weight.T
