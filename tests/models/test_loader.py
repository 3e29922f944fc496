"""Loading a Hugging Face directory: sharded safetensors via the index file, EOS ids
from generation_config.json, clear errors for what is missing."""

import json
import shutil

import pytest
import torch
import transformers

from amity.models.loader import load_model


def test_sharded_checkpoint_loads_the_same_weights(tiny_llama_path, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_llama_path))
    sharded = tmp_path / "sharded"
    model.save_pretrained(str(sharded), max_shard_size="100KB")
    shards = list(sharded.glob("*.safetensors"))
    assert len(shards) > 2 and (sharded / "model.safetensors.index.json").exists()
    for f in tiny_llama_path.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, sharded / f.name)
    whole = load_model(tiny_llama_path, torch.float32, torch.device("cpu")).model.state_dict()
    parts = load_model(sharded, torch.float32, torch.device("cpu")).model.state_dict()
    assert whole.keys() == parts.keys()
    for name in whole:
        assert torch.equal(whole[name], parts[name]), name


def test_eos_ids_come_from_generation_config(tiny_llama_path, tmp_path):
    directory = tmp_path / "eos"
    shutil.copytree(tiny_llama_path, directory)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    loaded = load_model(directory, torch.float32, torch.device("cpu"))
    assert {7, 9} <= loaded.tokenizer.eos_token_ids


def test_a_missing_weight_is_a_clear_error(tiny_llama_path, tmp_path):
    from safetensors.torch import load_file, save_file

    directory = tmp_path / "partial"
    shutil.copytree(tiny_llama_path, directory)
    [file] = directory.glob("*.safetensors")
    tensors = load_file(str(file))
    del tensors["model.norm.weight"]
    save_file(tensors, str(file), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="model.norm.weight"):
        load_model(directory, torch.float32, torch.device("cpu"))
