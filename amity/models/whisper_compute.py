"""How a loaded Whisper computes on a CPU: which kernel each matrix product takes.

Measured on the 2-core AVX512-BF16 host (benchmarks/README.md, Transcription): MKL's
float32 GEMM is slow at the decoder's few rows per step (8 rows through the 51864-token
LM head: 27 ms, our packed float32 kernel 7.7 ms, our bfloat16 kernel 3.8 ms), and
the encoder's 1500 rows per window are compute-bound, where oneDNN's bfloat16 runs
about 1.8x float32.

- `float32` (an explicit `--dtype float32`, the path the parity tests check against
  transformers): every decoder linear layer and the LM head through our packed
  float32 kernel (fixed accumulation order at every batch size, as the LLM engine's
  `none`); the encoder and the cross-attention K/V projections as loaded (MKL).
- `bf16` (the default where the CPU has AVX512-BF16): the same decoder layers, the LM
  head through our bfloat16 kernel (vdpbf16ps, float32 sums; batch-invariant too), and
  the encoder and the cross-attention K/V projections under torch's bfloat16 autocast
  (oneDNN: convolutions and linears in bfloat16; layer norms, residuals and the
  encoder's self-attention in float32).
  The cross-attention K/V are kept in float32: attention of one query row over 1500
  positions was 4x slower in bfloat16 (torch's CPU bmm has no fast path for it).
"""

import torch
from torch import nn

from amity.models.cpu_kernels import cpu_has
from amity.models.quantization import Bf16Linear, PackedLinear
from amity.models.whisper import Whisper

PRECISIONS = ("float32", "bf16")


def default_precision(dtype: str, device: torch.device) -> str:
    """`auto` on a CPU with AVX512-BF16 computes in bfloat16 where it pays; any
    explicit dtype (or another CPU) keeps float32."""
    return "bf16" if dtype == "auto" and device.type == "cpu" and cpu_has("avx512_bf16") else "float32"


def prepare_whisper(model: Whisper, precision: str) -> None:
    """Swap `model`'s decoder linears and LM head for our CPU kernels and set the
    encoder's autocast dtype, in place (a float32 model on a CPU)."""
    if precision not in PRECISIONS:
        raise ValueError(f"Whisper precision {precision!r} is not one of {PRECISIONS}")
    # Engines built on one loaded model (tests share one) find its layers in place.
    if model.compute_precision is not None:
        if model.compute_precision != precision:
            raise ValueError(f"this Whisper already computes in {model.compute_precision}; load it again")
        return
    for layer in model.decoder.layers:
        for attention in (layer.self_attn, layer.encoder_attn):
            # The cross K/V projections run once per window over 1500 rows: MKL/oneDNN's.
            names = ("q_proj", "k_proj", "v_proj", "out_proj") if attention is layer.self_attn \
                else ("q_proj", "out_proj")
            for name in names:
                setattr(attention, name, PackedLinear(getattr(attention, name), "loaded"))
        layer.fc1 = PackedLinear(layer.fc1, "loaded")
        layer.fc2 = PackedLinear(layer.fc2, "loaded")
    embedding = model.decoder.embed_tokens.weight
    tied = nn.Linear(embedding.shape[1], embedding.shape[0], bias=False)
    tied.weight = embedding
    model.lm_head = Bf16Linear(tied) if precision == "bf16" else PackedLinear(tied, "loaded")
    model.encoder_autocast = torch.bfloat16 if precision == "bf16" else None
    model.compute_precision = precision
