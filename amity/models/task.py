"""What a checkpoint is for: "embed", "classify" or "generate" (`amity serve --task`
overrides it).

- a sentence-transformers directory (`modules.json`): "classify" with a linear head
  (setfit_head.py), else "embed";
- a Hugging Face directory whose `config.architectures` is a `*ForSequenceClassification`:
  "classify"; a bare encoder (`BertModel`, ...): "embed";
- anything else, GGUF files included: "generate".
"""

import json
from pathlib import Path

from amity.models.pooling_registry import ENCODER_ARCHITECTURES
from amity.models.setfit_head import has_head

TASKS = ("embed", "classify", "generate")


def detect_task(path: str | Path) -> str:
    path = Path(path)
    if path.is_file():
        return "generate"
    if (path / "modules.json").exists():
        return "classify" if has_head(path) else "embed"
    config = path / "config.json"
    architectures = (json.loads(config.read_text()).get("architectures") or []) if config.exists() else []
    if any(name.endswith("ForSequenceClassification") for name in architectures):
        return "classify"
    if any(name in ENCODER_ARCHITECTURES for name in architectures):
        return "embed"
    return "generate"
