"""Reading a PEFT LoRA adapter directory (`adapter_config.json` +
`adapter_model.safetensors`) into plain tensors, checked against the base model.

Every way an adapter can be wrong is refused here with a message that says what
is wrong, before anything reaches the engine: missing files, a non-LoRA or DoRA
config, a target we do not adapt (embeddings, the LM head, `modules_to_save`,
trained biases), a rank above `--max-lora-rank`, or shapes that are not the
base's.

The scale of each module is PEFT's: `lora_alpha / r`, or `lora_alpha / sqrt(r)`
with `use_rslora`, where r is that module's own rank (so `rank_pattern`, which
only changes ranks, needs nothing more; `alpha_pattern` is refused).
"""

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

# PEFT's key of one factor: base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A|B}.weight
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class AdapterError(ValueError):
    """An adapter that cannot be served, and why."""


@dataclass
class LoraFactors:
    a: torch.Tensor  # [rank, in_features]
    b: torch.Tensor  # [out_features, rank]
    scale: float

    @property
    def rank(self) -> int:
        return self.a.shape[0]


@dataclass
class LoraAdapter:
    path: Path
    # (layer index, projection name, e.g. "q_proj") -> its factors
    modules: dict[tuple[int, str], LoraFactors]

    @property
    def max_rank(self) -> int:
        return max(f.rank for f in self.modules.values())


def _read_config(directory: Path) -> dict:
    config_path = directory / "adapter_config.json"
    if not directory.is_dir():
        raise AdapterError(f"adapter path {str(directory)!r} is not a directory")
    if not config_path.is_file():
        raise AdapterError(f"{directory} has no adapter_config.json: not a PEFT adapter directory")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise AdapterError(f"cannot read {config_path}: {error}") from error
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{directory} is a {config.get('peft_type')} adapter; only LORA is served")
    for key, why in (("use_dora", "DoRA adapters are not supported"),
                     ("modules_to_save", "fully trained modules (modules_to_save) are not supported"),
                     ("alpha_pattern", "per-module lora_alpha (alpha_pattern) is not supported"),
                     ("fan_in_fan_out", "fan_in_fan_out (GPT-2 Conv1D) weights are not supported")):
        if config.get(key):
            raise AdapterError(f"{directory}: {why}")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{directory}: trained biases (bias={config['bias']!r}) are not supported")
    return config


def read_adapter(directory: str | Path, layer_shapes: dict[str, tuple[int, int]], num_layers: int,
                 max_rank: int) -> LoraAdapter:
    """The adapter at `directory`, checked against the base: `layer_shapes` maps each
    projection name to its (in_features, out_features)."""
    directory = Path(directory)
    config = _read_config(directory)
    weights_path = directory / "adapter_model.safetensors"
    if not weights_path.is_file():
        raise AdapterError(f"{directory} has no adapter_model.safetensors")
    try:
        tensors = load_file(str(weights_path))
    except Exception as error:  # a truncated or foreign file: safetensors' own message says how
        raise AdapterError(f"cannot read {weights_path}: {error}") from error
    factors: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None or match.group(2) not in TARGETS:
            raise AdapterError(f"{directory}: unsupported adapter weight {key!r}; LoRA adapts only "
                               f"the decoder layers' {', '.join(TARGETS)}")
        layer, name, side = int(match.group(1)), match.group(2), match.group(3)
        if layer >= num_layers:
            raise AdapterError(f"{directory}: {key!r} names layer {layer}; the base model has {num_layers}")
        factors.setdefault((layer, name), {})[side] = tensor
    if not factors:
        raise AdapterError(f"{directory}: adapter_model.safetensors holds no LoRA weights")
    alpha = config.get("lora_alpha", config.get("r", 8))
    modules = {}
    for (layer, name), pair in sorted(factors.items()):
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"{directory}: layer {layer} {name} lacks its lora_{'A' if 'A' not in pair else 'B'}")
        a, b = pair["A"], pair["B"]
        in_features, out_features = layer_shapes[name]
        rank = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != in_features or b.shape != (out_features, rank):
            raise AdapterError(
                f"{directory}: layer {layer} {name} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)}; "
                f"the base model needs [r, {in_features}] and [{out_features}, r]: an adapter of another base model?")
        if rank > max_rank:
            raise AdapterError(f"{directory}: layer {layer} {name} has rank {rank}, above --max-lora-rank {max_rank}")
        scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        modules[(layer, name)] = LoraFactors(a.float(), b.float(), scale)
    return LoraAdapter(directory, modules)
