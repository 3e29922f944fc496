"""What the engine runs, loaded for its task: a generative decoder, a decoder with a
pooling head, or an encoder.

- "generate": a causal LM (loader.py). It also pools, as vLLM embeds with a decoder:
  its last prompt token's final hidden state, L2-normalised.
- "embed" on a causal LM checkpoint: the same model and pooling (a decoder embedder,
  e.g. a Qwen3-Embedding-style checkpoint).
- "embed" / "classify" on a pooling checkpoint (pooling_loader.py): a decoder
  classifier (`*ForSequenceClassification` on the Llama family) runs paged, as a
  causal LM does; an encoder (BERT family) runs whole sequences with no KV cache.

The task is `EngineConfig.task`, by default what the checkpoint says (task.py).
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from amity.config import EngineConfig
from amity.engine.pooler import Pooler
from amity.models.loader import LoadedModel, default_model_path, load_model
from amity.models.pooling import Pooling
from amity.models.pooling_loader import load_pooling_model
from amity.models.prompt_rows import resolve_prompt_tiles
from amity.models.quantization import quantize_model, resolve_scheme
from amity.models.task import detect_task
from amity.models.tokenizer import Tokenizer

DECODER_POOLING = Pooling("last", normalize=True)


@dataclass
class EngineModel:
    network: nn.Module  # paged: embed/forward (and compute_logits to generate); encoder: hidden_states
    config: object  # transformers PretrainedConfig
    tokenizer: Tokenizer
    path: Path
    task: str  # "generate", "embed" or "classify": what the server exposes
    pooler: Pooler  # how pooling requests become outputs
    is_encoder: bool  # whole sequences, no KV cache
    max_input_len: int | None = None  # a pooling checkpoint's own limit (position table, max_seq_length)
    lowercase: bool = False  # sentence-transformers' do_lower_case

    @property
    def can_generate(self) -> bool:
        return hasattr(self.network, "compute_logits")

    def encode_input(self, text: str) -> list[int]:
        """The token ids of one pooling input, special tokens included."""
        return self.tokenizer.encode(text.lower() if self.lowercase else text)

    @classmethod
    def generative(cls, loaded: LoadedModel, task: str = "generate") -> "EngineModel":
        return cls(loaded.model, loaded.config, loaded.tokenizer, loaded.path, task, Pooler(DECODER_POOLING),
                   is_encoder=False)


def load_engine_model(config: EngineConfig, dtype: torch.dtype, device: torch.device,
                      before_quantize: Callable[[nn.Module], None] | None = None) -> EngineModel:
    """`before_quantize` sees a decoder's modules as loaded (LoRA wraps them there)."""
    path = Path(config.model) if config.model else default_model_path()
    if not path.exists():
        raise FileNotFoundError(f"model path {path} does not exist")
    detected = detect_task(path)
    scheme = resolve_scheme(config.quantization, config.dtype)
    prompt_tiles = resolve_prompt_tiles(config.prompt_tiles, device)
    task = config.task or detected
    if task == "generate" and detected != "generate":
        raise ValueError(f"{path} is an {detected} model; it cannot generate text (--task {detected})")
    if detected == "generate":
        if task == "classify":
            raise ValueError(f"{path} has no classification head; serve it with --task generate or embed")
        loaded = load_model(path, dtype, device)
        if before_quantize is not None:
            before_quantize(loaded.model)
        loaded.model = quantize_model(loaded.model, scheme, device, loaded.file_weights, prompt_tiles)
        return EngineModel.generative(loaded, task)
    loaded = load_pooling_model(path, dtype, device, task)
    if before_quantize is not None:
        if not hasattr(loaded.model.network, "embed"):
            raise ValueError(f"{path} is an encoder; LoRA adapters serve decoders here (causal LMs and "
                             "decoder classifiers)")
        before_quantize(loaded.model.network)  # a decoder classifier: its body as a causal LM's
    model = quantize_model(loaded.model, scheme, device, prompt_tiles=prompt_tiles)
    network = model.network
    head = network.logits if model.labels is not None else None
    return EngineModel(network, loaded.config, loaded.tokenizer, loaded.path, task,
                       Pooler(model.pooling, head, model.labels), is_encoder=not hasattr(network, "embed"),
                       max_input_len=loaded.max_model_len, lowercase=loaded.lowercase)
