"""Shared fixtures: tiny random-weight Hugging Face checkpoints built at test time.

The tokenizer is a small byte-level BPE trained here on a few sentences (building
the default model's 49k-token tokenizer from its GGUF takes ~7 s; this takes
milliseconds). The models' vocab is exactly the tokenizer's, so every id the model
can produce decodes.
"""

import json
from pathlib import Path

import pytest
import torch

TINY_VOCAB = 384

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time there was a little engine that could serve many requests at once.",
    "Paged attention keeps the key and value cache in fixed-size blocks.",
    "Hello, world! How are you today? I am fine, thank you.",
    "A prefix cache lets a second request reuse the blocks of the first one.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000, and punctuation: ; : - ( ) [ ] { }.",
    "Stop strings may span token boundaries, so the detokenizer must hold text back.",
]


def _build_tokenizer(directory: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer)
    # No EOS token: random weights would stop at random points.
    hf = PreTrainedTokenizerFast(tokenizer_object=tok)
    hf.save_pretrained(str(directory))
    return len(hf)


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-tokenizer")
    _build_tokenizer(directory)
    return directory


def _tiny_config(arch: str, vocab_size: int):
    import transformers

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  initializer_range=0.2, rms_norm_eps=1e-6, bos_token_id=0, eos_token_id=0,
                  tie_word_embeddings=False)
    if arch == "llama":
        return transformers.LlamaConfig(**common)
    if arch == "llama3":  # llama3 rope scaling, with a short original context so it matters
        return transformers.LlamaConfig(**common, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if arch == "smollm2":  # SmolLM2 is a Llama with tied embeddings and no GQA
        return transformers.LlamaConfig(**{**common, "tie_word_embeddings": True,
                                           "num_key_value_heads": 4})
    if arch == "mistral":
        return transformers.MistralConfig(**common, sliding_window=None, head_dim=16)
    if arch == "qwen2":
        return transformers.Qwen2Config(**common)
    if arch == "qwen3":  # head_dim != hidden / heads
        return transformers.Qwen3Config(**{**common, "head_dim": 32})
    raise KeyError(arch)


def build_tiny_model(arch: str, directory: Path, tokenizer_dir: Path) -> Path:
    """Save a random-weight `arch` checkpoint plus the tiny tokenizer to `directory`."""
    import transformers

    vocab_size = len(transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    config = _tiny_config(arch, vocab_size)
    torch.manual_seed(1234)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("_proj.bias"):  # Qwen2's qkv bias is zero-initialised
                param.normal_(0.0, 0.2)
            elif name.endswith("norm.weight"):  # ones would hide a mixed-up norm
                param.uniform_(0.5, 1.5)
    model.save_pretrained(str(directory))
    for f in tokenizer_dir.iterdir():
        (directory / f.name).write_bytes(f.read_bytes())
    # No EOS in generation_config: random weights would stop at random points.
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": None}))
    return directory


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory, tiny_tokenizer_dir):
    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = build_tiny_model(arch, tmp_path_factory.mktemp(f"tiny-{arch}"),
                                           tiny_tokenizer_dir)
        return built[arch]

    return get


@pytest.fixture(scope="session")
def tiny_llama_path(tiny_model_factory) -> Path:
    return tiny_model_factory("llama")
