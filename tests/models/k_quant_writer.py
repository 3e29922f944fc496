"""GGUF K-quant bytes for tests: gguf-py quantizes no K-quant, so these build
ggml's block_q4_K / block_q6_K from a float matrix with plain round-to-nearest
scales (not llama.cpp's searched ones; the layout is what matters here). The
bytes are checked against gguf-py's own dequantize, which defines the format."""

import numpy as np


def _f16(values: np.ndarray) -> np.ndarray:  # -> the float16 values, as float32
    return values.astype(np.float16).astype(np.float32)


def quantize_q4_k(weight: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> [rows, cols / 256 x 144] uint8."""
    rows = weight.shape[0]
    w = weight.astype(np.float32).reshape(rows, -1, 8, 32)  # [row, super, sub, input]
    low = np.minimum(w.min(-1), 0)  # the offset -dmin m is never positive
    span = (w.max(-1) - low) / 15
    d = _f16(span.max(-1) / 63)
    dmin = _f16(-low.min(-1) / 63)
    sc = np.clip(np.round(span / np.where(d == 0, 1, d)[..., None]), 0, 63).astype(np.uint8)
    m = np.clip(np.round(-low / np.where(dmin == 0, 1, dmin)[..., None]), 0, 63).astype(np.uint8)
    step = d[..., None] * sc
    q = np.round((w + (dmin[..., None] * m)[..., None]) / np.where(step == 0, 1, step)[..., None])
    q = np.clip(q, 0, 15).astype(np.uint8)
    # ggml's get_scale_min_k4, inverted: 6-bit scales and mins 0-3 in bytes 0-7,
    # 4-7 split into low nibbles (bytes 8-11) and top two bits (bytes 0-7's spare bits).
    scales = np.concatenate([sc[..., :4] | ((sc[..., 4:] >> 4) << 6), m[..., :4] | ((m[..., 4:] >> 4) << 6),
                             (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)], axis=-1)
    qs = (q[..., 0::2, :] | (q[..., 1::2, :] << 4)).reshape(*q.shape[:2], 128)  # sub-blocks 2j, 2j + 1
    header = np.stack([d, dmin], axis=-1).astype(np.float16).view(np.uint8)
    return np.concatenate([header, scales, qs], axis=-1).reshape(rows, -1)


def quantize_q6_k(weight: np.ndarray) -> np.ndarray:
    """[rows, cols] float -> [rows, cols / 256 x 210] uint8."""
    rows = weight.shape[0]
    w = weight.astype(np.float32).reshape(rows, -1, 16, 16)  # [row, super, sub, input]
    step = np.abs(w).max(-1) / 31
    d = _f16(step.max(-1) / 127)
    sc = np.clip(np.round(step / np.where(d == 0, 1, d)[..., None]), 0, 127).astype(np.int8)
    full = d[..., None] * sc
    q = np.clip(np.round(w / np.where(full == 0, 1, full)[..., None]) + 32, 0, 63).astype(np.uint8)
    # Per half of 128 inputs, four runs of 32: ql's low nibbles (bytes 0-31, 32-63),
    # then its high ones, the top 2 bits in qh's bits 0-1, 2-3, 4-5, 6-7.
    runs = q.reshape(rows, -1, 2, 4, 32)
    ql = np.concatenate([(runs[..., 0, :] & 15) | ((runs[..., 2, :] & 15) << 4),
                         (runs[..., 1, :] & 15) | ((runs[..., 3, :] & 15) << 4)], axis=-1)
    qh = sum((runs[..., i, :] >> 4) << (2 * i) for i in range(4)).astype(np.uint8)
    parts = [ql.reshape(rows, -1, 128), qh.reshape(rows, -1, 64), sc.view(np.uint8),
             d.astype(np.float16)[..., None].view(np.uint8)]
    return np.concatenate(parts, axis=-1).reshape(rows, -1)


QUANTIZE = {"Q4_K": quantize_q4_k, "Q6_K": quantize_q6_k}
