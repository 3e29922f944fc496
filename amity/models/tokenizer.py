"""The tokenizer the engine and server share, loaded from a model directory or a GGUF file.

A thin face over a `transformers` fast tokenizer: the engine needs ids in and text
out, the server also needs the chat template. GGUF files carry their vocabulary,
merges, special tokens and chat template in metadata; `transformers` converts them,
which takes seconds (gguf-py parses every metadata field of the file), so the
converted tokenizer is kept as a tokenizer folder and later starts load that
(`_gguf_tokenizer`).
"""

import hashlib
import logging
import os
import shutil
from pathlib import Path

import transformers
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from amity.models.cache_dir import amity_cache_dir

logger = logging.getLogger("amity.models")


def _gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """A GGUF's tokenizer, converted once per file (its path, size and modification
    time) and transformers release, then loaded from the cache's folder."""
    stat = path.stat()
    identity = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{transformers.__version__}"
    folder = amity_cache_dir() / "tokenizers" / hashlib.sha256(identity.encode()).hexdigest()[:32]
    if (folder / "tokenizer_config.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(folder))
        except Exception:  # noqa: BLE001 - any damage (a full disk, a hand edit): convert again
            logger.warning("the cached tokenizer in %s cannot be read; converting the GGUF's again", folder)
            shutil.rmtree(folder, ignore_errors=True)
    hf = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    # Written aside and renamed into place, so a concurrent start never reads half a folder.
    staging = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
    try:
        hf.save_pretrained(str(staging))
        staging.rename(folder)
    except OSError:  # another start got there first, or the cache is not writable
        shutil.rmtree(staging, ignore_errors=True)
    return hf


class Tokenizer:
    def __init__(self, hf_tokenizer: PreTrainedTokenizerBase, eos_token_ids: set[int]):
        self.hf = hf_tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.vocab_size = len(hf_tokenizer)
        self.all_special_ids = frozenset(hf_tokenizer.all_special_ids)

    @classmethod
    def from_path(cls, model_path: str | Path, extra_eos_token_ids: set[int] = frozenset()):
        path = Path(model_path)
        if path.is_file():  # GGUF
            hf = _gguf_tokenizer(path)
        else:
            hf = AutoTokenizer.from_pretrained(str(path))
        eos = set(extra_eos_token_ids)
        if hf.eos_token_id is not None:
            eos.add(hf.eos_token_id)
        return cls(hf, eos)

    @property
    def chat_template(self) -> str | None:
        return self.hf.chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(token_ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str:
        return self.hf.convert_ids_to_tokens(token_id)

    def convert_ids_to_tokens(self, token_ids: list[int]) -> list[str]:
        return self.hf.convert_ids_to_tokens(token_ids)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return self.hf.convert_tokens_to_string(tokens)

    def apply_chat_template(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs,
    ) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template; use /v1/completions")
        return self.hf.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **template_kwargs,
        )
