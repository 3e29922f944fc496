"""Loading a pooling model, embedding or classification, from a directory.

Three layouts:
- a sentence-transformers directory (`modules.json`; sentence_transformers_layout.py):
  its body, pooling and normalisation, and with a linear head (setfit_head.py) a
  classifier;
- a Hugging Face `*ForSequenceClassification` directory: its body and head, labels
  from `config.id2label`;
- a Hugging Face bare encoder (`BertModel`, ...): CLS pooling, L2-normalised.

Weights come from safetensors or pytorch_model.bin (weights_only) under the
checkpoint's names (loader.py's `fill_weights`); `task` ("embed" / "classify", by
default what task.py detects) chooses between a checkpoint's embeddings and its
classification head.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig

from amity.models.loader import fill_weights, instantiate, iter_checkpoint_weights
from amity.models.pooling import Pooling
from amity.models.pooling_model import PoolingModel, SentenceTransformerClassifier
from amity.models.pooling_registry import SENTENCE_TRANSFORMER_BODIES, pooling_network_class
from amity.models.sentence_transformers_layout import read_sentence_transformer
from amity.models.setfit_head import load_linear_head
from amity.models.task import detect_task
from amity.models.tokenizer import Tokenizer

POOLING_TASKS = ("embed", "classify")


@dataclass
class LoadedPoolingModel:
    model: PoolingModel
    config: object  # the network's transformers PretrainedConfig
    tokenizer: Tokenizer
    path: Path
    max_model_len: int  # tokens per input, special tokens included; longer inputs are refused
    lowercase: bool  # sentence-transformers' do_lower_case

    @property
    def task(self) -> str:
        return self.model.task

    def tokenize(self, text: str) -> list[int]:
        """Token ids of one input, special tokens ([CLS] ... [SEP]) included."""
        return self.tokenizer.encode(text.lower() if self.lowercase else text)


def load_pooling_model(model_path: str | Path, dtype: torch.dtype, device: torch.device,
                       task: str | None = None) -> LoadedPoolingModel:
    path = Path(model_path)
    if not path.is_dir():
        raise FileNotFoundError(f"a pooling model is a directory; {path} is not one")
    detected = detect_task(path)
    task = task or detected
    if task not in POOLING_TASKS:
        raise ValueError(f"{path} is a {detected} model; a pooling model serves {' or '.join(POOLING_TASKS)}")
    if task == "classify" and detected != "classify":
        raise ValueError(f"{path} has no classification head: it is an {detected} model")
    if (path / "modules.json").exists():
        loaded = _load_sentence_transformer(path, task, dtype, device)
    else:
        loaded = _load_hf_directory(path, task, dtype, device)
    loaded.model.eval()
    return loaded


def _load_network(cls: type, config, directory: Path, dtype, device,
                  rename: Callable[[str], str]) -> torch.nn.Module:
    network = instantiate(cls, config, dtype, device)
    fill_weights(network, ((rename(name), tensor) for name, tensor in iter_checkpoint_weights(directory)),
                 directory)
    return network


def _load_hf_directory(path: Path, task: str, dtype, device) -> LoadedPoolingModel:
    config = AutoConfig.from_pretrained(str(path))
    cls = pooling_network_class(config)
    network = _load_network(cls, config, path, dtype, device, getattr(cls, "checkpoint_name", str))
    if task == "classify":
        labels = [config.id2label[i] for i in range(config.num_labels)]
        pooling = Pooling(cls.default_pooling, normalize=False)
    else:
        labels, pooling = None, Pooling(cls.default_pooling, normalize=True)
    return LoadedPoolingModel(PoolingModel(network, pooling, labels), config, Tokenizer.from_path(path),
                              path, cls.max_sequence_len(config), lowercase=False)


def _load_sentence_transformer(path: Path, task: str, dtype, device) -> LoadedPoolingModel:
    layout = read_sentence_transformer(path)
    config = AutoConfig.from_pretrained(str(layout.body_dir))
    if config.model_type not in SENTENCE_TRANSFORMER_BODIES:
        raise ValueError(f"sentence-transformers body {config.model_type!r} is not supported; supported: "
                         f"{', '.join(SENTENCE_TRANSFORMER_BODIES)}")
    cls, prefix = SENTENCE_TRANSFORMER_BODIES[config.model_type]
    checkpoint_name = getattr(cls, "checkpoint_name", str)

    def rename(name: str) -> str:  # a body saved under a task head's class keeps its prefix
        return checkpoint_name(name.removeprefix(prefix))

    network = _load_network(cls, config, layout.body_dir, dtype, device, rename)
    pooling, labels = layout.pooling, None
    if task == "classify":
        head, labels, normalize = load_linear_head(path)
        network = SentenceTransformerClassifier(network, head.to(device=device, dtype=dtype))
        pooling = Pooling(pooling.method, normalize=pooling.normalize or normalize)
    max_len = cls.max_sequence_len(config)
    if layout.max_seq_length:
        max_len = min(max_len, layout.max_seq_length)
    return LoadedPoolingModel(PoolingModel(network, pooling, labels), config,
                              Tokenizer.from_path(layout.body_dir), path, max_len, layout.lowercase)
