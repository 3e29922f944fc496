"""Tiny random-weight pooling checkpoints against `transformers`, float32.

Each checkpoint (tests/models/conftest.py: hidden 64, 2 layers, weights and biases
drawn far from their initialisation) is saved with save_pretrained and read back
by amity's pooling loader. Five sequences of 1 to 60 tokens run packed in one batch
through amity and one at a time through transformers:

- bare encoders: every token's hidden state, max |diff| <= HIDDEN_ATOL (1e-5, on
  LayerNorm outputs of magnitude ~1);
- classifiers: softmax probabilities in label-id order, max |diff| <= PROBS_ATOL
  (1e-5), and the labels are config.id2label's.
"""

import pytest
import torch
import transformers

from amity.models.packed_batch import pack
from amity.models.pooling_loader import load_pooling_model

HIDDEN_ATOL = 1e-5
PROBS_ATOL = 1e-5
ENCODERS = ["bert", "roberta", "xlm-roberta", "distilbert"]
CLASSIFIERS = ENCODERS + ["llama", "qwen2", "qwen3"]
CPU = torch.device("cpu")


def random_sequences(vocab_size: int, lengths=(1, 7, 60, 23, 2)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(0)
    # From id 1: 0 is the encoders' pad token, which transformers' RoBERTa positions skip.
    return [torch.randint(1, vocab_size, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("arch", ENCODERS)
def test_encoder_hidden_states_match_transformers(arch, pooling_checkpoint):
    path = pooling_checkpoint(arch, head=False)
    loaded = load_pooling_model(path, torch.float32, CPU)
    assert loaded.task == "embed"
    hf = transformers.AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    sequences = random_sequences(hf.config.vocab_size)
    ours = loaded.model.network.hidden_states(pack(sequences))
    with torch.no_grad():
        ref = torch.cat([hf(torch.tensor([s])).last_hidden_state[0] for s in sequences])
    diff = (ours - ref).abs().max().item()
    assert diff <= HIDDEN_ATOL, f"{arch}: max |hidden diff| {diff:.2e}"


@pytest.mark.parametrize("arch", CLASSIFIERS)
def test_classifier_probabilities_match_transformers(arch, pooling_checkpoint):
    path = pooling_checkpoint(arch)
    loaded = load_pooling_model(path, torch.float32, CPU)
    assert loaded.task == "classify"
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(str(path), dtype=torch.float32).eval()
    assert loaded.model.labels == [hf.config.id2label[i] for i in range(3)] == ["negative", "neutral", "positive"]
    sequences = random_sequences(hf.config.vocab_size)
    ours = loaded.model(pack(sequences))
    with torch.no_grad():
        ref = torch.cat([hf(torch.tensor([s])).logits.softmax(-1) for s in sequences])
    assert ours.shape == (len(sequences), 3)
    # Not degenerate: the texts get different, unsaturated answers.
    assert ref.max() < 0.999 and (ref.max(0).values - ref.min(0).values).max() > 0.05, ref
    diff = (ours - ref).abs().max().item()
    assert diff <= PROBS_ATOL, f"{arch}: max |probs diff| {diff:.2e}"


def test_roberta_position_offset_matters(pooling_checkpoint):
    """Otherwise the RoBERTa cases would pass with positions counted from 0."""
    from amity.models.bert import BertModel

    path = pooling_checkpoint("roberta", head=False)
    loaded = load_pooling_model(path, torch.float32, CPU)
    network = loaded.model.network
    assert type(network).position_offset(network.config) == 1  # pad_token_id 0 + 1
    batch = pack(random_sequences(network.config.vocab_size))
    shifted = network.hidden_states(batch)
    network.position_offset = BertModel.position_offset  # positions from row 0
    assert (network.hidden_states(batch) - shifted).abs().max() > 100 * HIDDEN_ATOL
