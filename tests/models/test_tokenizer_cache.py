"""A GGUF's tokenizer, converted by transformers on the first load, comes from the
cache's folder on later ones (models/tokenizer.py) and must be the same tokenizer."""

import os
import time

from transformers import AutoTokenizer

from amity.models import tokenizer as tokenizer_module
from amity.models.shipped import default_model_path
from amity.models.tokenizer import Tokenizer

TEXTS = ["Hello, world!", "  leading spaces\tand tabs\n", "naïve café — 東京 🚀", "<|im_start|>user\nhi<|im_end|>"]


def test_the_cached_tokenizer_is_the_converted_one(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = default_model_path()
    converted = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    first = Tokenizer.from_path(path)  # converts and writes the folder
    [folder] = (tmp_path / "amity" / "tokenizers").iterdir()
    original, calls = tokenizer_module.AutoTokenizer.from_pretrained, []

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(tokenizer_module.AutoTokenizer, "from_pretrained", spy)
    cached = Tokenizer.from_path(path)
    assert calls == [((str(folder),), {})]  # the folder, not the GGUF
    for tok in (first, cached):
        for text in TEXTS:
            ids = converted.encode(text)
            assert tok.encode(text) == ids
            assert tok.encode(text, add_special_tokens=False) == converted.encode(text, add_special_tokens=False)
            assert tok.decode(ids) == converted.decode(ids, skip_special_tokens=True)
            assert tok.decode(ids, skip_special_tokens=False) == converted.decode(ids)
        assert tok.vocab_size == len(converted) and tok.eos_token_ids == {converted.eos_token_id}
        assert tok.all_special_ids == frozenset(converted.all_special_ids)
        assert tok.chat_template == converted.chat_template
        messages = [{"role": "user", "content": "What is 2 + 2?"}]
        assert tok.apply_chat_template(messages) == converted.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True)


def test_a_changed_file_is_converted_again(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    copy = tmp_path / "model.gguf"
    copy.write_bytes(default_model_path().read_bytes())
    Tokenizer.from_path(copy)
    later = time.time() + 10
    os.utime(copy, (later, later))
    Tokenizer.from_path(copy)
    assert len(list((tmp_path / "amity" / "tokenizers").iterdir())) == 2


def test_a_damaged_cache_is_converted_again(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = default_model_path()
    expected = Tokenizer.from_path(path).encode(TEXTS[2])
    [folder] = (tmp_path / "amity" / "tokenizers").iterdir()
    (folder / "tokenizer.json").write_text('{"truncated')
    assert Tokenizer.from_path(path).encode(TEXTS[2]) == expected
    assert Tokenizer.from_path(path).encode(TEXTS[2]) == expected  # from the folder written again
    assert (folder / "tokenizer.json").stat().st_size > 1000
