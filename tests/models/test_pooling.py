"""Pooling, the sentence-transformers and SetFit layouts, task detection, batch invariance.

sentence-transformers itself is the reference for its directories: tiny random
encoders (tests/models/conftest.py) wrapped in its Transformer + Pooling (+
Normalize) modules and saved by it, against its own `encode` on the same texts:
every vector within VECTOR_ATOL (1e-5, on vectors of norm ~1 or, unnormalised, of
entries ~1).
"""

import json
import shutil

import numpy as np
import pytest
import torch

from amity.models.cpu_kernels import load_cpu_kernels
from amity.models.packed_batch import pack
from amity.models.pooling import Pooling, pool
from amity.models.pooling_loader import load_pooling_model
from amity.models.quantization import quantize_model
from amity.models.setfit_head import PICKLED_HEAD, save_linear_head
from amity.models.task import detect_task

VECTOR_ATOL = 1e-5
CPU = torch.device("cpu")
TEXTS = ["", "Set an alarm for seven.", "The quick brown fox jumps over the lazy dog, and then it sleeps.",
         "What is the weather like tomorrow in Paris? Unknown words: zyx qwv!", "A man plays a guitar."]


def test_pooling_methods_match_a_per_sequence_reference():
    gen = torch.Generator().manual_seed(0)
    lens = [3, 1, 6, 2]
    hidden = torch.randn(sum(lens), 8, generator=gen)
    batch = pack([[1] * n for n in lens])
    per_seq = hidden.split(lens)
    torch.testing.assert_close(pool(hidden, batch.seq_starts, "mean"), torch.stack([s.mean(0) for s in per_seq]))
    assert torch.equal(pool(hidden, batch.seq_starts, "cls"), torch.stack([s[0] for s in per_seq]))
    assert torch.equal(pool(hidden, batch.seq_starts, "last"), torch.stack([s[-1] for s in per_seq]))
    normalized = Pooling("mean", normalize=True)(hidden, batch)
    torch.testing.assert_close(normalized.norm(dim=-1), torch.ones(len(lens)))
    with pytest.raises(ValueError, match="max"):
        Pooling("max", normalize=False)
    with pytest.raises(ValueError, match="empty"):
        pack([[1, 2], []])


def _sentence_transformer_dir(encoder_dir, pooling_mode: str, normalize: bool, directory):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling as STPooling, Transformer

    body = Transformer(str(encoder_dir))
    modules = [body, STPooling(body.get_embedding_dimension(), pooling_mode=pooling_mode)]
    model = SentenceTransformer(modules=modules + [Normalize()] if normalize else modules, device="cpu")
    model.save(str(directory))
    return model


@pytest.mark.parametrize("arch,mode,normalize", [("bert", "mean", True), ("bert", "cls", False),
                                                 ("roberta", "lasttoken", True), ("distilbert", "mean", False)])
def test_sentence_transformers_directory_matches_its_encode(arch, mode, normalize, pooling_checkpoint, tmp_path):
    reference = _sentence_transformer_dir(pooling_checkpoint(arch, head=False), mode, normalize, tmp_path)
    assert detect_task(tmp_path) == "embed"
    loaded = load_pooling_model(tmp_path, torch.float32, CPU)
    assert loaded.task == "embed"
    assert loaded.model.pooling == Pooling({"lasttoken": "last"}.get(mode, mode), normalize)
    # sentence-transformers takes max_position_embeddings as RoBERTa's limit too, two
    # past its last usable position: the position table is the tighter bound there.
    positions_limit = type(loaded.model.network).max_sequence_len(loaded.config)
    assert loaded.max_model_len == min(reference.max_seq_length, positions_limit)
    ours = loaded.model(pack([loaded.tokenize(t) for t in TEXTS]))
    ref = reference.encode(TEXTS, convert_to_tensor=True, batch_size=len(TEXTS))
    assert ours.shape == ref.shape and (ours - ours[0]).abs().max() > 0.1  # the texts differ
    diff = (ours - ref).abs().max().item()
    assert diff <= VECTOR_ATOL, f"{arch} {mode}: max |vector diff| {diff:.2e}"


def test_a_setfit_head_gives_a_logistic_regressions_probabilities(pooling_checkpoint, tmp_path):
    reference = _sentence_transformer_dir(pooling_checkpoint("bert", head=False), "mean", False, tmp_path)
    # Each label's row points at one text's (centred) embedding, so the texts get different labels.
    anchors = reference.encode(TEXTS[1:], normalize_embeddings=True)
    coef = 30 * (anchors - anchors.mean(0))
    intercept = np.random.default_rng(0).normal(0, 1, 4)
    labels = ["alarm", "weather", "music", "other"]
    save_linear_head(tmp_path, coef, intercept, labels, normalize_embeddings=True)
    assert detect_task(tmp_path) == "classify"
    loaded = load_pooling_model(tmp_path, torch.float32, CPU)
    assert loaded.task == "classify" and loaded.model.labels == labels
    probs = loaded.model(pack([loaded.tokenize(t) for t in TEXTS])).numpy()
    embeddings = reference.encode(TEXTS, normalize_embeddings=True)
    scores = embeddings @ coef.T + intercept
    expected = np.exp(scores - scores.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    assert expected.max() < 0.999 and len(set(expected.argmax(1))) > 1  # not degenerate
    np.testing.assert_allclose(probs, expected, atol=1e-5, rtol=0)
    # The same body without its head: --task embed serves its (here unnormalised) vectors.
    embedder = load_pooling_model(tmp_path, torch.float32, CPU, task="embed")
    np.testing.assert_allclose(embedder.model(pack([embedder.tokenize(t) for t in TEXTS])).numpy(),
                               reference.encode(TEXTS), atol=VECTOR_ATOL, rtol=0)


def test_a_binary_setfit_head_is_a_sigmoid(pooling_checkpoint, tmp_path):
    reference = _sentence_transformer_dir(pooling_checkpoint("bert", head=False), "cls", True, tmp_path)
    gen = np.random.default_rng(1)
    coef, intercept = gen.normal(0, 3, (1, 64)), gen.normal(0, 1, 1)
    save_linear_head(tmp_path, coef, intercept, ["no", "yes"], normalize_embeddings=False)
    loaded = load_pooling_model(tmp_path, torch.float32, CPU)
    probs = loaded.model(pack([loaded.tokenize(t) for t in TEXTS])).numpy()
    yes = 1 / (1 + np.exp(-(reference.encode(TEXTS) @ coef.T + intercept)[:, 0]))
    np.testing.assert_allclose(probs, np.stack([1 - yes, yes], 1), atol=1e-5, rtol=0)


def test_task_detection_and_its_errors(pooling_checkpoint, tiny_llama_path, tmp_path):
    assert detect_task(pooling_checkpoint("bert")) == "classify"
    assert detect_task(pooling_checkpoint("qwen2")) == "classify"
    assert detect_task(pooling_checkpoint("distilbert", head=False)) == "embed"
    assert detect_task(tiny_llama_path) == "generate"
    with pytest.raises(ValueError, match="generate model"):
        load_pooling_model(tiny_llama_path, torch.float32, CPU)
    with pytest.raises(ValueError, match="no classification head: it is an embed model"):
        load_pooling_model(pooling_checkpoint("bert", head=False), torch.float32, CPU, task="classify")
    # --task embed on a classifier: its body's pooled, normalised hidden states.
    embedder = load_pooling_model(pooling_checkpoint("bert"), torch.float32, CPU, task="embed")
    assert embedder.task == "embed" and embedder.model.pooling == Pooling("cls", normalize=True)


def test_what_amity_cannot_run_is_refused_by_name(pooling_checkpoint, tmp_path):
    st_dir = tmp_path / "st"
    _sentence_transformer_dir(pooling_checkpoint("bert", head=False), "mean", False, st_dir)
    pickled = tmp_path / "pickled"
    shutil.copytree(st_dir, pickled)
    (pickled / PICKLED_HEAD).write_bytes(b"not read")
    assert detect_task(pickled) == "classify"
    with pytest.raises(ValueError, match="pickle"):
        load_pooling_model(pickled, torch.float32, CPU)
    dense = tmp_path / "dense"
    shutil.copytree(st_dir, dense)
    modules = json.loads((dense / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (dense / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ValueError, match="Dense"):
        load_pooling_model(dense, torch.float32, CPU)
    max_pooling = tmp_path / "max"
    shutil.copytree(st_dir, max_pooling)
    config_path = max_pooling / modules[1]["path"] / "config.json"
    config = json.loads(config_path.read_text())
    config["pooling_mode"] = "max"
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="pooling 'max' is not supported"):
        load_pooling_model(max_pooling, torch.float32, CPU)


def test_pytorch_model_bin_loads_the_same_weights(pooling_checkpoint, tmp_path):
    from safetensors.torch import load_file

    path = pooling_checkpoint("roberta")
    for f in path.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    # The legacy format (transformers 5 no longer writes it): a pickled dict of tensors.
    torch.save(load_file(str(path / "model.safetensors")), tmp_path / "pytorch_model.bin")
    a = load_pooling_model(path, torch.float32, CPU).model.state_dict()
    b = load_pooling_model(tmp_path, torch.float32, CPU).model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("arch", ["bert", "distilbert", "qwen2"])
def test_a_texts_output_does_not_depend_on_its_batch(arch, pooling_checkpoint):
    """With the engine's CPU layers (quantize_model "none": the packed kernel, whose
    every token is the same float computation in any batch) a text's probabilities
    are bitwise what they are alone, wherever it sits in the batch; with torch's
    nn.Linear (MKL) they agree to BATCH_ATOL."""
    load_cpu_kernels()
    loaded = load_pooling_model(pooling_checkpoint(arch), torch.float32, CPU)
    gen = torch.Generator().manual_seed(3)
    vocab = loaded.config.vocab_size
    sequences = [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in (5, 40, 1, 17, 33, 9)]

    def alone_packed_reversed(model):
        alone = torch.cat([model(pack([s])) for s in sequences])
        return alone, model(pack(sequences)), model(pack(sequences[::-1])).flip(0)

    alone, packed, reversed_ = alone_packed_reversed(loaded.model)
    assert (packed - alone).abs().max() <= 1e-6 and (reversed_ - alone).abs().max() <= 1e-6
    quantize_model(loaded.model, "none", CPU)
    alone, packed, reversed_ = alone_packed_reversed(loaded.model)
    assert torch.equal(packed, alone) and torch.equal(reversed_, alone)
