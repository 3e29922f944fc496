"""Dequantize GGUF tensor data to float32 torch tensors.

Every format is a run of fixed-size blocks (`gguf.GGML_QUANT_SIZES` gives elements
and bytes per block), so each decoder takes a `(n_blocks, bytes_per_block)` uint8
tensor and unpacks all blocks at once with shifts, masks and reshapes. The byte
layouts follow ggml's `block_*` structs (ggml-common.h) as read by
`gguf/quants.py`; the arithmetic is done in the same order as there, in float32, so
results match it exactly.
"""

import math
from typing import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

_U8 = torch.uint8


def _f16(b: torch.Tensor) -> torch.Tensor:
    """(n, 2) little-endian half bytes -> (n, 1) float32."""
    return b.contiguous().view(torch.float16).float()


def _shifts(*s: int) -> torch.Tensor:
    return torch.tensor(s, dtype=_U8)


def _split_bits(x: torch.Tensor, shifts: torch.Tensor, mask: int) -> torch.Tensor:
    """(n, ..., k) -> (n, ..., len(shifts), k): one slice per bit-field of each byte."""
    return (x.unsqueeze(-2) >> shifts.view(-1, 1)) & mask


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    # Legacy blocks store element j in the low nibble of byte j and element j + 16
    # in its high nibble, so low nibbles come first.
    return _split_bits(qs, _shifts(0, 4), 0x0F).flatten(-2)


def _high_bits32(qh: torch.Tensor) -> torch.Tensor:
    """(n, 4) bytes of a little-endian uint32 -> (n, 32) bits, bit j for element j."""
    return ((qh.unsqueeze(-1) >> _shifts(*range(8))) & 1).flatten(-2)


def _f32(b: torch.Tensor) -> torch.Tensor:
    return b.view(torch.float32)


def _f16_plain(b: torch.Tensor) -> torch.Tensor:
    return b.view(torch.float16).float()


def _bf16(b: torch.Tensor) -> torch.Tensor:
    return b.view(torch.bfloat16).float()


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].view(torch.int8).float() * _f16(b[:, :2])


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 2:]).to(torch.int16) - 8
    return _f16(b[:, :2]) * q.float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b[:, :2]) * _nibbles(b[:, 4:]).float() + _f16(b[:, 2:4])


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    q = (_nibbles(b[:, 6:]) | (_high_bits32(b[:, 2:6]) << 4)).to(torch.int16) - 16
    return _f16(b[:, :2]) * q.float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 8:]) | (_high_bits32(b[:, 4:8]) << 4)
    return _f16(b[:, :2]) * q.float() + _f16(b[:, 2:4])


def _k_scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins, as float32.

    Bytes 0-3 hold scales 0-3 (low 6 bits), bytes 4-7 mins 0-3; scales/mins 4-7 keep
    their low nibbles in bytes 8-11 and their top two bits in the spare bits of 0-7.
    """
    s = s.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.float(), mn.float()


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc).unsqueeze(-1)
    dm = (_f16(b[:, 2:4]) * mn).unsqueeze(-1)
    # Each 32-byte chunk holds two 32-element sub-blocks: low nibbles, then high.
    q = _split_bits(b[:, 16:].reshape(n, 4, 32), _shifts(0, 4), 0x0F).reshape(n, 8, 32)
    return (d * q.float() - dm).reshape(n, 256)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    d = (_f16(b[:, :2]) * sc).unsqueeze(-1)
    dm = (_f16(b[:, 2:4]) * mn).unsqueeze(-1)
    ql = _split_bits(b[:, 48:].reshape(n, 4, 32), _shifts(0, 4), 0x0F).reshape(n, 8, 32)
    # Sub-block i takes its fifth bit from bit i of the 32 qh bytes.
    qh = _split_bits(b[:, 16:48], _shifts(*range(8)), 1)
    return (d * (ql | (qh << 4)).float() - dm).reshape(n, 256)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = (_f16(b[:, 208:210]) * scales).unsqueeze(-1)
    # Two halves of 128 elements; in each, 64 ql bytes give 4 runs of 32 (low nibbles
    # of bytes 0-31, 32-63, then high nibbles) and 32 qh bytes the matching 2-bit tops.
    ql = _split_bits(b[:, :128].reshape(n, 2, 64), _shifts(0, 4), 0x0F).reshape(n, 8, 32)
    qh = _split_bits(b[:, 128:192].reshape(n, 2, 32), _shifts(0, 2, 4, 6), 0x03).reshape(n, 8, 32)
    q = (ql | (qh << 4)).to(torch.int16) - 32
    return (d * q.reshape(n, 16, 16).float()).reshape(n, 256)


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, :16]
    dl = (_f16(b[:, 80:82]) * (scales & 0x0F).float()).unsqueeze(-1)
    ml = (_f16(b[:, 82:84]) * (scales >> 4).float()).unsqueeze(-1)
    q = _split_bits(b[:, 16:80].reshape(n, 2, 32), _shifts(0, 2, 4, 6), 0x03).reshape(n, 16, 16)
    return (dl * q.float() - ml).reshape(n, 256)


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask, qs, s = b[:, :32], b[:, 32:96], b[:, 96:108]
    # 16 six-bit scales: low nibbles in bytes 0-7 (low then high nibble), top two
    # bits in bytes 8-11, two bits per scale.
    lo = _split_bits(s[:, :8], _shifts(0, 4), 0x0F).flatten(-2)
    hi = _split_bits(s[:, 8:], _shifts(0, 2, 4, 6), 0x03).flatten(-2)
    sc = (lo | (hi << 4)).to(torch.int16) - 32
    dl = (_f16(b[:, 108:110]) * sc.float()).unsqueeze(-1)
    ql = _split_bits(qs.reshape(n, 2, 32), _shifts(0, 2, 4, 6), 0x03).reshape(n, 16, 16)
    qh = _split_bits(hmask.reshape(n, 1, 32), _shifts(*range(8)), 1).reshape(n, 16, 16)
    # A set hmask bit means "no offset"; a clear one subtracts 4.
    q = ql.to(torch.int16) - ((qh ^ 1).to(torch.int16) << 2)
    return (dl * q.float()).reshape(n, 256)


_DECODERS: dict[Q, Callable[[torch.Tensor], torch.Tensor]] = {
    Q.F32: _f32,
    Q.F16: _f16_plain,
    Q.BF16: _bf16,
    Q.Q8_0: _q8_0,
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q5_0: _q5_0,
    Q.Q5_1: _q5_1,
    Q.Q2_K: _q2_k,
    Q.Q3_K: _q3_k,
    Q.Q4_K: _q4_k,
    Q.Q5_K: _q5_k,
    Q.Q6_K: _q6_k,
}

SUPPORTED_TYPES: tuple[Q, ...] = tuple(_DECODERS)


def _as_bytes(data: np.ndarray) -> torch.Tensor:
    a = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    # GGUFReader hands out read-only memmap views; torch wants writable memory.
    # Copying the (compact) encoded bytes of one tensor is cheap next to the output.
    if not a.flags.writeable:
        a = a.copy()
    return torch.from_numpy(a)


def dequantize(data: np.ndarray, qtype: Q, shape: tuple[int, ...]) -> torch.Tensor:
    """Decode one tensor's data to float32 with torch `shape` (rows x cols, i.e. GGUF's
    dims reversed). `data` is raw bytes (uint8) or the typed array GGUFReader gives."""
    qtype = Q(qtype)
    decode = _DECODERS.get(qtype)
    if decode is None:
        names = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise ValueError(f"GGUF tensor type {qtype.name} is not supported; supported: {names}")
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n = math.prod(shape)
    raw = _as_bytes(data)
    if n % block_size or raw.numel() != n // block_size * type_size:
        raise ValueError(
            f"{qtype.name} data of {raw.numel()} bytes does not hold a tensor of "
            f"shape {tuple(shape)}"
        )
    return decode(raw.view(-1, type_size)).reshape(shape)
