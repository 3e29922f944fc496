"""A GGUF file's metadata and tensor table, read from its memory map.

gguf-py's `GGUFReader` builds a numpy view for every element of every metadata
array: for the default model's vocabulary (49,152 tokens, 48,900 merges) that is
2.3 s of every start, more beside the start's other work. This reader decodes
scalars, keeps numeric arrays as numpy views of the map, and walks string arrays
only to find their end, decoding them when asked. Tensors are views of the map in
gguf-py's shapes: F32 / F16 (and the integer types) as typed arrays, everything
else as bytes, one row of blocks per row. Little-endian files only (what
llama.cpp writes; gguf-py's big-endian variant is refused).

Format: "GGUF", version (3), tensor count, metadata count; each metadata entry a
key, a value type and a value; each tensor a name, its dims (fastest first), a
type and an offset into the data, which starts at the next multiple of
`general.alignment` (32) after the table.
"""

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# Metadata value types (gguf's GGUFValueType): the fixed-size ones' little-endian dtypes.
_SCALARS = {code: np.dtype(kind) for code, kind in (
    (0, "<u1"), (1, "<i1"), (2, "<u2"), (3, "<i2"), (4, "<u4"), (5, "<i4"), (6, "<f4"), (7, "?"),
    (10, "<u8"), (11, "<i8"), (12, "<f8"))}
_STRING, _ARRAY = 8, 9
# Tensor types gguf-py gives as typed arrays; the rest are bytes.
_TYPED = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
          GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
          GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
          GGMLQuantizationType.I64: np.int64}


class StringArray(Sequence):
    """A metadata array of strings, decoded on first access."""

    def __init__(self, buffer: memoryview, offset: int, count: int):
        self._buffer, self._offset, self._count = buffer, offset, count
        self._values: list[str] | None = None

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index):
        if self._values is None:
            values, offset = [], self._offset
            for _ in range(self._count):
                value, offset = _string(self._buffer, offset)
                values.append(value)
            self._values = values
        return self._values[index]


@dataclass(frozen=True)
class GgufTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF's dims, fastest first (torch's shape reversed)
    data: np.ndarray  # a read-only view of the map


def _string(buffer: memoryview, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", buffer, offset)
    start = offset + 8
    return str(buffer[start:start + length], "utf-8"), start + length


def _skip_strings(buffer: memoryview, offset: int, count: int) -> int:
    unpack = struct.Struct("<Q").unpack_from
    for _ in range(count):
        offset += 8 + unpack(buffer, offset)[0]
    return offset


class GgufFile:
    """`fields`: metadata key -> value (a number, bool, str, numpy array or
    StringArray); `tensors`: the tensor table, in the file's order."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        buffer = memoryview(self._map)
        if bytes(buffer[:4]) != b"GGUF":
            raise ValueError(f"{self.path} is not a GGUF file")
        version, num_tensors, num_fields = struct.unpack_from("<IQQ", buffer, 4)
        if version not in (2, 3):
            raise ValueError(f"{self.path}: GGUF version {version} is not supported (a big-endian "
                             "file, or a format newer than 3)")
        offset = 24
        self.fields: dict = {}
        for _ in range(num_fields):
            key, offset = _string(buffer, offset)
            (value_type,) = struct.unpack_from("<I", buffer, offset)
            self.fields[key], offset = self._value(buffer, offset + 4, value_type)
        table = []
        for _ in range(num_tensors):
            name, offset = _string(buffer, offset)
            (num_dims,) = struct.unpack_from("<I", buffer, offset)
            dims = struct.unpack_from(f"<{num_dims}Q", buffer, offset + 4)
            tensor_type, data_offset = struct.unpack_from("<IQ", buffer, offset + 4 + 8 * num_dims)
            offset += 4 + 8 * num_dims + 12
            table.append((name, dims, GGMLQuantizationType(tensor_type), data_offset))
        alignment = int(self.fields.get("general.alignment", 32))
        start = -(-offset // alignment) * alignment
        self.tensors = [self._tensor(start, *entry) for entry in table]

    def _value(self, buffer: memoryview, offset: int, value_type: int):
        if value_type == _STRING:
            return _string(buffer, offset)
        if value_type in _SCALARS:
            dtype = _SCALARS[value_type]
            return self._map[offset:offset + dtype.itemsize].view(dtype)[0].item(), offset + dtype.itemsize
        if value_type != _ARRAY:
            raise ValueError(f"{self.path}: unknown GGUF value type {value_type}")
        item_type, count = struct.unpack_from("<IQ", buffer, offset)
        offset += 12
        if item_type == _STRING:
            return StringArray(buffer, offset, count), _skip_strings(buffer, offset, count)
        if item_type in _SCALARS:
            dtype = _SCALARS[item_type]
            values = self._map[offset:offset + count * dtype.itemsize].view(dtype)
            return values, offset + count * dtype.itemsize
        values = []  # arrays of arrays: none in llama.cpp's files, but the format allows them
        for _ in range(count):
            value, offset = self._value(buffer, offset, item_type)
            values.append(value)
        return values, offset

    def _tensor(self, start: int, name: str, dims: tuple[int, ...], tensor_type: GGMLQuantizationType,
                data_offset: int) -> GgufTensor:
        block_size, type_size = GGML_QUANT_SIZES[tensor_type]
        num_elements = int(np.prod(dims))
        num_bytes = num_elements // block_size * type_size
        first = start + data_offset
        data = self._map[first:first + num_bytes]
        if len(data) != num_bytes:
            raise ValueError(f"{self.path}: tensor {name} runs past the end of the file")
        shape = tuple(reversed(dims))
        if tensor_type in _TYPED:
            data = data.view(_TYPED[tensor_type]).reshape(shape)
        else:
            data = data.reshape(*shape[:-1], shape[-1] // block_size * type_size)
        return GgufTensor(name, tensor_type, tuple(int(d) for d in dims), data)
