"""CTranslate2's `model.bin` (binary format version 6), read with numpy alone.

The file is a header (version, spec name, spec revision), then named arrays, each
`name, rank, dims, dtype id, byte count, bytes`, then aliases (one name standing for
another array, e.g. a decoder's tied projection). Strings are a uint16 length
(including a NUL terminator) and UTF-8 bytes. All integers are little-endian.
"""

import struct
from collections.abc import Iterable
from pathlib import Path

import numpy as np

# CTranslate2's DataType enum.
_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
SUPPORTED_VERSION = 6


class _Cursor:
    def __init__(self, data: memoryview):
        self.data, self.offset = data, 0

    def unpack(self, fmt: str):
        value = struct.unpack_from("<" + fmt, self.data, self.offset)
        self.offset += struct.calcsize("<" + fmt)
        return value[0] if len(value) == 1 else value

    def string(self) -> str:
        length = self.unpack("H")
        text = bytes(self.data[self.offset:self.offset + length - 1]).decode()
        self.offset += length
        return text

    def take(self, num_bytes: int) -> memoryview:
        chunk = self.data[self.offset:self.offset + num_bytes]
        if len(chunk) != num_bytes:
            raise ValueError("model.bin is truncated")
        self.offset += num_bytes
        return chunk


def read_model_bin(parts: Iterable[Path]) -> tuple[str, dict[str, np.ndarray]]:
    """The spec name and every array (aliases resolved) of a model.bin, given as one
    file or as the parts that concatenate to it."""
    data = memoryview(b"".join(Path(p).read_bytes() for p in parts))
    cursor = _Cursor(data)
    version = cursor.unpack("I")
    if version != SUPPORTED_VERSION:
        raise ValueError(f"model.bin format version {version} is not supported (only {SUPPORTED_VERSION})")
    spec = cursor.string()
    cursor.unpack("I")  # the spec's revision
    arrays: dict[str, np.ndarray] = {}
    for _ in range(cursor.unpack("I")):
        name = cursor.string()
        rank = cursor.unpack("B")
        shape = tuple(cursor.unpack("I") for _ in range(rank))
        dtype_id = cursor.unpack("B")
        raw = cursor.take(cursor.unpack("I"))
        if dtype_id not in _DTYPES:
            raise ValueError(f"array {name!r} has CTranslate2 dtype {dtype_id}, which is not supported")
        arrays[name] = np.frombuffer(raw, dtype=_DTYPES[dtype_id]).reshape(shape)
    for _ in range(cursor.unpack("I")):
        alias, target = cursor.string(), cursor.string()
        arrays[alias] = arrays[target]
    return spec, arrays
