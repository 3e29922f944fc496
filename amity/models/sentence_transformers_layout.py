"""Reading a sentence-transformers directory: which modules run, in what order, with what settings.

`modules.json` lists them; amity runs the common pipeline, a `Transformer` (the
body, a Hugging Face model in the module's folder, `""` for the directory itself),
a `Pooling` (`1_Pooling/config.json`: mean, CLS or last token) and optionally a
`Normalize`. Any other module (Dense, LayerNorm, Router, ...) is refused by name
rather than skipped, since skipping it would change every vector.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from amity.models.pooling import Pooling

# sentence-transformers' pooling mode names -> ours
_POOLING_MODES = {"mean": "mean", "cls": "cls", "lasttoken": "last"}
# Its older config spelling, one boolean per mode.
_LEGACY_POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                        "pooling_mode_mean_tokens": "mean",
                        "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                        "pooling_mode_weightedmean_tokens": "weightedmean",
                        "pooling_mode_lasttoken": "lasttoken"}


@dataclass(frozen=True)
class SentenceTransformerLayout:
    body_dir: Path
    pooling: Pooling
    max_seq_length: int | None  # sentence_bert_config.json's: longer inputs are refused, not truncated
    lowercase: bool  # do_lower_case: texts are lowercased before tokenizing


def _module_kind(module: dict) -> str:
    return module["type"].rsplit(".", 1)[-1]  # the class name, whichever package path names it


def _pooling_mode(config: dict) -> str:
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [m for key, m in _LEGACY_POOLING_KEYS.items() if config.get(key)] or ["mean"]
        mode = modes[0] if len(modes) == 1 else modes
    if isinstance(mode, list) and len(mode) == 1:
        mode = mode[0]
    if not isinstance(mode, str) or mode not in _POOLING_MODES:
        raise ValueError(f"sentence-transformers pooling {mode!r} is not supported; supported: "
                         f"{', '.join(_POOLING_MODES)}")
    return _POOLING_MODES[mode]


def read_sentence_transformer(directory: Path) -> SentenceTransformerLayout:
    modules = sorted(json.loads((directory / "modules.json").read_text()), key=lambda m: m["idx"])
    kinds = [_module_kind(m) for m in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ValueError(f"sentence-transformers modules {kinds} are not supported; supported: "
                         "Transformer, Pooling, and optionally Normalize")
    body_dir = directory / modules[0]["path"]
    pooling_config = json.loads((directory / modules[1]["path"] / "config.json").read_text())
    body_config_path = body_dir / "sentence_bert_config.json"
    body_config = json.loads(body_config_path.read_text()) if body_config_path.exists() else {}
    return SentenceTransformerLayout(
        body_dir=body_dir,
        pooling=Pooling(_pooling_mode(pooling_config), normalize=kinds[-1] == "Normalize"),
        max_seq_length=body_config.get("max_seq_length"),
        lowercase=bool(body_config.get("do_lower_case", False)))
