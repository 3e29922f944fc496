"""Whisper checkpoints: a Hugging Face directory or a CTranslate2 (faster-whisper) one.

- HF: `config.json` (WhisperConfig), `model.safetensors`, `generation_config.json`
  (suppress tokens, languages), `tokenizer.json`.
- CTranslate2: `model.bin` (read by ctranslate2_reader.py, no ctranslate2 needed) or
  its parts `model.bin.part1`, `model.bin.part2`, ... (packages split big files),
  `config.json` (suppress_ids, suppress_ids_begin, lang_ids) and `tokenizer.json`.
  Fused projections are split onto HF's names; the keys' zero bias is dropped.

`WhisperVocab` carries what generation needs of the tokenizer: the special tokens,
the languages, and the suppression lists.
"""

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerFast

from amity.models.ctranslate2_reader import read_model_bin
from amity.models.tokenizer import Tokenizer
from amity.models.whisper import Whisper, WhisperDims

# OpenAI's rule: the multilingual vocabularies have 51865 tokens or more (large-v3: 51866).
MULTILINGUAL_VOCAB_SIZE = 51865


@dataclass(frozen=True)
class WhisperVocab:
    eot: int  # <|endoftext|>
    sot: int  # <|startoftranscript|>
    sot_prev: int  # <|startofprev|>
    transcribe: int
    translate: int
    no_timestamps: int
    language_ids: dict[str, int]  # ISO-639-1 code -> token id; empty for English-only models
    suppress_ids: tuple[int, ...]  # never generated
    begin_suppress_ids: tuple[int, ...]  # not generated first

    @property
    def is_multilingual(self) -> bool:
        return bool(self.language_ids)


@dataclass
class LoadedWhisper:
    model: Whisper
    tokenizer: Tokenizer
    vocab: WhisperVocab
    path: Path


def is_whisper_dir(path: str | Path) -> bool:
    path = Path(path)
    config = path / "config.json"
    if not path.is_dir() or not config.exists():
        return False
    data = json.loads(config.read_text())
    return data.get("model_type") == "whisper" or "suppress_ids_begin" in data


def model_bin_parts(path: Path) -> list[Path]:
    if (path / "model.bin").exists():
        return [path / "model.bin"]
    parts = sorted(path.glob("model.bin.part*"), key=lambda p: int(p.name.removeprefix("model.bin.part")))
    if not parts:
        raise FileNotFoundError(f"{path} has neither model.bin nor model.bin.part1, ...")
    return parts


def _split(prefix: str, weight: np.ndarray, bias: np.ndarray, names: tuple[str, ...]) -> dict:
    out = {}
    for name, w, b in zip(names, np.split(weight, len(names)), np.split(bias, len(names))):
        out[f"{prefix}.{name}.weight"] = w
        if name != "k_proj":
            out[f"{prefix}.{name}.bias"] = b
    return out


def _ct2_state_dict(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    sd: dict[str, np.ndarray] = {}

    def linear(dst: str, src: str):
        sd[f"{dst}.weight"], sd[f"{dst}.bias"] = arrays[f"{src}/weight"], arrays[f"{src}/bias"]

    def norm(dst: str, src: str):
        sd[f"{dst}.weight"], sd[f"{dst}.bias"] = arrays[f"{src}/gamma"], arrays[f"{src}/beta"]

    for side in ("encoder", "decoder"):
        sd[f"{side}.embed_positions.weight"] = arrays[f"{side}/position_encodings/encodings"]
        norm(f"{side}.layer_norm", f"{side}/layer_norm")
        i = 0
        while f"{side}/layer_{i}/ffn/linear_0/weight" in arrays:
            dst, src = f"{side}.layers.{i}", f"{side}/layer_{i}"
            sa = f"{src}/self_attention"
            sd.update(_split(f"{dst}.self_attn", arrays[f"{sa}/linear_0/weight"],
                             arrays[f"{sa}/linear_0/bias"], ("q_proj", "k_proj", "v_proj")))
            linear(f"{dst}.self_attn.out_proj", f"{sa}/linear_1")
            norm(f"{dst}.self_attn_layer_norm", f"{sa}/layer_norm")
            if side == "decoder":
                ca = f"{src}/attention"
                linear(f"{dst}.encoder_attn.q_proj", f"{ca}/linear_0")
                sd.update(_split(f"{dst}.encoder_attn", arrays[f"{ca}/linear_1/weight"],
                                 arrays[f"{ca}/linear_1/bias"], ("k_proj", "v_proj")))
                linear(f"{dst}.encoder_attn.out_proj", f"{ca}/linear_2")
                norm(f"{dst}.encoder_attn_layer_norm", f"{ca}/layer_norm")
            linear(f"{dst}.fc1", f"{src}/ffn/linear_0")
            linear(f"{dst}.fc2", f"{src}/ffn/linear_1")
            norm(f"{dst}.final_layer_norm", f"{src}/ffn/layer_norm")
            i += 1
    for conv in ("conv1", "conv2"):
        linear(f"encoder.{conv}", f"encoder/{conv}")
    sd["decoder.embed_tokens.weight"] = arrays["decoder/embeddings/weight"]
    return sd


def _dims_from_state_dict(sd: dict, encoder_heads: int, decoder_heads: int) -> WhisperDims:
    def count(side):
        return sum(1 for k in sd if k.startswith(f"{side}.layers.") and k.endswith(".fc1.weight"))
    vocab_size, d_model = sd["decoder.embed_tokens.weight"].shape
    return WhisperDims(
        num_mel_bins=sd["encoder.conv1.weight"].shape[1], d_model=d_model,
        encoder_layers=count("encoder"), encoder_heads=encoder_heads,
        decoder_layers=count("decoder"), decoder_heads=decoder_heads,
        ffn_dim=sd["encoder.layers.0.fc1.weight"].shape[0], vocab_size=vocab_size,
        max_source_positions=sd["encoder.embed_positions.weight"].shape[0],
        max_target_positions=sd["decoder.embed_positions.weight"].shape[0])


def _vocab(hf: PreTrainedTokenizerFast, language_ids: list[int], suppress, begin_suppress) -> WhisperVocab:
    def tid(token: str) -> int:
        token_id = hf.convert_tokens_to_ids(token)
        if token_id is None or token_id == hf.unk_token_id:
            raise ValueError(f"the tokenizer has no {token}")
        return token_id
    languages = {hf.convert_ids_to_tokens(i)[2:-2]: i for i in language_ids}
    return WhisperVocab(
        eot=tid("<|endoftext|>"), sot=tid("<|startoftranscript|>"), sot_prev=tid("<|startofprev|>"),
        transcribe=tid("<|transcribe|>"), translate=tid("<|translate|>"),
        no_timestamps=tid("<|notimestamps|>"), language_ids=languages,
        suppress_ids=tuple(suppress), begin_suppress_ids=tuple(begin_suppress))


def load_whisper(path: str | Path, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> LoadedWhisper:
    path = Path(path)
    config = json.loads((path / "config.json").read_text())
    hf = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    if config.get("model_type") == "whisper":
        sd = {k.removeprefix("model."): v for k, v in load_file(path / "model.safetensors").items()
              if k != "proj_out.weight"}
        dims = _dims_from_state_dict(sd, config["encoder_attention_heads"], config["decoder_attention_heads"])
        generation = json.loads((path / "generation_config.json").read_text())
        vocab = _vocab(hf, sorted((generation.get("lang_to_id") or {}).values()),
                       generation.get("suppress_tokens") or [],
                       generation.get("begin_suppress_tokens") or [])
    else:
        spec, arrays = read_model_bin(model_bin_parts(path))
        if spec != "WhisperSpec":
            raise ValueError(f"{path}/model.bin holds a {spec}, not a WhisperSpec")
        sd = {k: torch.from_numpy(v.copy()) for k, v in _ct2_state_dict(arrays).items()}
        dims = _dims_from_state_dict(sd, int(arrays["encoder/num_heads"]), int(arrays["decoder/num_heads"]))
        vocab = _vocab(hf, config.get("lang_ids") or [], config.get("suppress_ids") or [],
                       config.get("suppress_ids_begin") or [])
    if dims.vocab_size < MULTILINGUAL_VOCAB_SIZE:  # English-only: its language tokens are unused
        vocab = dataclasses.replace(vocab, language_ids={})
    model = Whisper(dims)
    model.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=True)
    model = model.to(device=device, dtype=dtype).eval()
    return LoadedWhisper(model, Tokenizer(hf, {vocab.eot}), vocab, path)
