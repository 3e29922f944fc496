"""GGUF's K-quants (Q4_K, Q6_K) as the block kernel reads them.

A K-quant row is made of super-blocks of 256 inputs: a float16 `d` (and for Q4_K a
float16 `dmin`) and one small integer scale per sub-block (Q4_K: 8 sub-blocks of 32,
6-bit `sc` and 6-bit min `m`; Q6_K: 16 sub-blocks of 16, int8 `sc`). The weight is
    Q4_K: d sc q - dmin m   (q 4-bit)
    Q6_K: d sc (q - 32)     (q 6-bit)
as ggml's `dequantize_row_q4_K` / `dequantize_row_q6_K` compute it (ggml-quants.c;
gguf-py's `quants.Q4_K` / `Q6_K` likewise). `k_quant_blocks` unpacks a matrix's raw
bytes into those fields, byte for byte; `k_quant_weight` is the float weight they
define, which tests hold against gguf-py's dequantize.
"""

from dataclasses import dataclass

import torch

SUPER_BLOCK = 256  # inputs per super-block
SUB_BLOCK = {"Q4_K": 32, "Q6_K": 16}  # inputs per sub-block scale
FILE_BYTES = {"Q4_K": 144, "Q6_K": 210}  # ggml's block_q4_K, block_q6_K
ZERO_POINT = {"Q4_K": 0, "Q6_K": 32}  # q minus this is the weight's integer


@dataclass
class KQuantBlocks:
    """One matrix's K-quant fields, rows first: q [out, in] uint8 (0-15 or 0-63),
    d [out, in / 256] float16, sc [out, in / sub] uint8 (Q6_K: int8's bytes), and
    for Q4_K dmin like d and m like sc."""

    kind: str
    q: torch.Tensor
    d: torch.Tensor
    sc: torch.Tensor
    dmin: torch.Tensor | None = None
    m: torch.Tensor | None = None

    @staticmethod
    def cat(parts: list["KQuantBlocks"]) -> "KQuantBlocks":
        """The shards of a merged layer, their rows one after another."""
        fields = {name: None if getattr(parts[0], name) is None else torch.cat([getattr(p, name) for p in parts])
                  for name in ("q", "d", "sc", "dmin", "m")}
        return KQuantBlocks(parts[0].kind, **fields)


def _f16(raw: torch.Tensor) -> torch.Tensor:  # [..., 2] bytes -> [...] float16
    return raw.contiguous().view(torch.float16).squeeze(-1)


def _q4_k_scales(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """12 bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4):
    bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 mins 0-3; scales and
    mins 4-7 keep their low nibbles in bytes 8-11 and their top two bits in the
    spare bits of bytes 0-7."""
    low, mid, top = raw[..., 0:4], raw[..., 4:8], raw[..., 8:12]
    sc = torch.cat([low & 0x3F, (top & 0x0F) | ((low >> 2) & 0x30)], dim=-1)
    m = torch.cat([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], dim=-1)
    return sc, m


def k_quant_blocks(kind: str, rows: torch.Tensor) -> KQuantBlocks:
    """A GGUF matrix's raw bytes ([out, bytes per row] uint8) as its fields."""
    out_features = rows.shape[0]
    blocks = rows.reshape(out_features, -1, FILE_BYTES[kind])
    n = blocks.shape[1]
    if kind == "Q4_K":  # d, dmin, scales[12], qs[128]
        sc, m = _q4_k_scales(blocks[..., 4:16])
        # Each 32 bytes of qs hold two sub-blocks: the low nibbles, then the high ones.
        qs = blocks[..., 16:].reshape(out_features, n, 4, 1, 32)
        q = torch.cat([qs & 15, qs >> 4], dim=3)
        return KQuantBlocks(kind, q.reshape(out_features, -1), _f16(blocks[..., 0:2]), sc.reshape(out_features, -1),
                            _f16(blocks[..., 2:4]), m.reshape(out_features, -1))
    if kind == "Q6_K":  # ql[128], qh[64], scales[16] int8, d
        # Each half of 128 inputs: 64 ql bytes and 32 qh bytes give four runs of 32,
        # the low nibbles of ql 0-31, of ql 32-63, then their high nibbles, with the
        # 2-bit tops from bits 0-1, 2-3, 4-5, 6-7 of qh.
        ql = blocks[..., :128].reshape(out_features, n, 2, 1, 2, 32)
        low = torch.cat([ql & 15, ql >> 4], dim=3)  # [out, n, half, nibble, ql half, 32]
        qh = blocks[..., 128:192].reshape(out_features, n, 2, 1, 32)
        top = torch.cat([(qh >> shift) & 3 for shift in (0, 2, 4, 6)], dim=3).reshape(out_features, n, 2, 2, 2, 32)
        q = low | (top << 4)
        return KQuantBlocks(kind, q.reshape(out_features, -1), _f16(blocks[..., 208:210]),
                            blocks[..., 192:208].reshape(out_features, -1))
    raise ValueError(f"not a K-quant this kernel takes: {kind}")


def k_quant_weight(b: KQuantBlocks) -> torch.Tensor:
    """The float32 weight [out, in] the fields define, with ggml's float steps."""
    out_features, in_features = b.q.shape
    sub = SUB_BLOCK[b.kind]
    per_super = SUPER_BLOCK // sub
    d = b.d.float().repeat_interleave(per_super, dim=1)
    sc = b.sc.view(torch.int8) if b.kind == "Q6_K" else b.sc
    q = b.q.reshape(out_features, -1, sub).float() - ZERO_POINT[b.kind]
    weight = (d * sc.float())[..., None] * q
    if b.kind == "Q4_K":
        weight = weight - (b.dmin.float().repeat_interleave(per_super, dim=1) * b.m.float())[..., None]
    return weight.reshape(out_features, in_features)
