"""Loading a model, its tokenizer and its EOS ids from a path.

Two sources: a Hugging Face directory (config.json, safetensors, possibly sharded,
tokenizer files, generation_config.json) or a single GGUF file. Both yield the
same thing, an HF config and (name, tensor) pairs under HF parameter names, so one
function builds the module and fills it.
"""

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm
from transformers import AutoConfig

from amity.models.file_weights import FLOAT_KINDS, FileWeight
from amity.models.llama import MergedLinear
from amity.models.registry import model_class
from amity.models.shipped import default_model_path
from amity.models.tokenizer import Tokenizer

@dataclass
class LoadedModel:
    model: torch.nn.Module
    config: object  # transformers PretrainedConfig
    tokenizer: Tokenizer
    path: Path
    # How the file stores each weight matrix (file_weights.py), for `--quantization auto`.
    file_weights: dict[str, FileWeight] = field(default_factory=dict)


def _checkpoint_files(directory: Path) -> list[Path]:
    """The weight files of a directory: safetensors (possibly sharded, through their
    index), else PyTorch's pytorch_model*.bin."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = directory / index_name
        if index.exists():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            return [directory / s for s in shards]
    files = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("pytorch_model*.bin"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors (or pytorch_model.bin) files in {directory}")
    return files


def iter_checkpoint_weights(directory: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every weight in a Hugging Face directory. A .bin is read with
    weights_only=True: tensors only, never arbitrary pickled objects."""
    for file in _checkpoint_files(directory):
        if file.suffix == ".bin":
            yield from torch.load(file, map_location="cpu", weights_only=True, mmap=True).items()
            continue
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def _hf_eos_token_ids(directory: Path) -> set[int]:
    path = directory / "generation_config.json"
    if not path.exists():
        return set()
    eos = json.loads(path.read_text()).get("eos_token_id")
    if eos is None:
        return set()
    return set(eos) if isinstance(eos, list) else {eos}


def _recording_dtypes(weights: Iterable[tuple[str, torch.Tensor]], formats: dict[str, FileWeight]):
    for name, tensor in weights:
        if tensor.dim() == 2 and tensor.dtype in FLOAT_KINDS:
            formats[name] = FileWeight(FLOAT_KINDS[tensor.dtype])
        yield name, tensor


def _source(path: Path):
    """config, (name, tensor) pairs, EOS ids, and the weights' formats (complete
    once the pairs are read)."""
    if path.is_file():
        from amity.models import gguf_loader

        return (gguf_loader.gguf_config(path), gguf_loader.iter_gguf_weights(path),
                gguf_loader.gguf_eos_token_ids(path), gguf_loader.gguf_file_weights(path))
    config = AutoConfig.from_pretrained(str(path))
    formats: dict[str, FileWeight] = {}
    return config, _recording_dtypes(iter_checkpoint_weights(path), formats), _hf_eos_token_ids(path), formats


def load_model(model_path: str | Path | None, dtype: torch.dtype, device: torch.device) -> LoadedModel:
    path = Path(model_path) if model_path else default_model_path()
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    config, weights, eos_ids, file_weights = _source(path)
    model = instantiate(model_class(config), config, dtype, device)
    fill_weights(model, tqdm(weights, desc=f"loading {path.name}", unit="tensor", delay=1.0,
                             total=None, leave=False), path)
    model.eval()
    tokenizer = Tokenizer.from_path(path, extra_eos_token_ids=eos_ids)
    return LoadedModel(model, config, tokenizer, path, file_weights)


def instantiate(cls: type, config, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    """`cls(config)` on `device` with its weights left for `fill_weights`: built on the
    meta device, so no time goes into random initialisation."""
    with torch.device("meta"):
        model = cls(config)
    model.to_empty(device=device).to(dtype=dtype)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    # Buffers (rotary tables) were built on meta; rebuild them for real, in float32.
    _reinit_buffers(model, config, device)
    return model


def fill_weights(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                 source: Path) -> None:
    """Copies each checkpoint tensor into the model's parameter of that name;
    checkpoint names the model lacks are skipped, a parameter no name fills is an error."""
    targets = _weight_targets(model)
    loaded: set[str] = set()
    for name, tensor in weights:
        if name not in targets:
            continue  # e.g. rotary inv_freq saved by old checkpoints, or an lm_head we tie
        target = targets[name]
        if target.shape != tensor.shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(tensor)
        loaded.add(name)
    missing = set(targets) - loaded
    if missing:
        raise ValueError(f"checkpoint {source} lacks weights: {sorted(missing)[:5]}...")


def _weight_targets(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Checkpoint name -> the tensor it fills: a parameter, or for a `MergedLinear`
    (q/k/v or gate/up as one matmul) the slice of it that holds one shard."""
    targets = dict(model.named_parameters())
    for prefix, module in model.named_modules():
        if not isinstance(module, MergedLinear):
            continue
        parent = prefix.rpartition(".")[0]
        for kind, param in module.named_parameters():
            del targets[f"{prefix}.{kind}"]
            offset = 0
            for shard, size in zip(module.shard_names, module.output_sizes):
                targets[f"{parent}.{shard}.{kind}"] = param.data.narrow(0, offset, size)
                offset += size
    return targets


def _reinit_buffers(model: torch.nn.Module, config, device: torch.device) -> None:
    from amity.models.rotary import RotaryEmbedding

    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            head_dim = module.cos.shape[-1]
            with torch.device(device):
                rebuilt = RotaryEmbedding(head_dim, config.max_position_embeddings,
                                          getattr(config, "rope_parameters", None))
            module.cos, module.sin = rebuilt.cos, rebuilt.sin
