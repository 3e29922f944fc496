"""A linear classification head over a sentence-transformer's embeddings, as plain arrays.

This is the SetFit layout (a sentence-transformers directory whose embeddings feed a
logistic regression) with the head stored as arrays instead of the pickled
scikit-learn object SetFit writes (`model_head.pkl`): unpickling runs code, so
amity never reads a pickle. In the sentence-transformers directory:

- `head.safetensors`: `coef` [num_labels, dim] and `intercept` [num_labels], float
  (scikit-learn's `coef_` and `intercept_`). A two-label head may be [1, dim] and
  [1], scikit-learn's binary layout: the score of label 1 against label 0.
- `config_setfit.json` (SetFit's own file): `labels`, the label of each id in id
  order (a list of strings), and `normalize_embeddings`: whether the embedding is
  L2-normalised before the head (on top of any `Normalize` module).

The probabilities are softmax(embedding @ coef.T + intercept), a multinomial
logistic regression's `predict_proba`; a binary head is padded with a zero row, so
softmax([0, z]) is its sigmoid(z).
"""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

HEAD_FILE = "head.safetensors"
SETFIT_CONFIG = "config_setfit.json"
PICKLED_HEAD = "model_head.pkl"  # what SetFit itself writes; never read


def has_head(directory: Path) -> bool:
    return (directory / HEAD_FILE).exists() or (directory / PICKLED_HEAD).exists()


def load_linear_head(directory: Path) -> tuple[nn.Linear, list[str], bool]:
    """The head as a float32 nn.Linear, the labels in id order, and whether the
    embedding is normalised first."""
    if not (directory / HEAD_FILE).exists():
        raise ValueError(f"{directory} holds its classification head as a pickle ({PICKLED_HEAD}), "
                         f"which amity does not load: convert it to {HEAD_FILE} (coef, intercept) "
                         f"and {SETFIT_CONFIG} (labels), see amity/models/setfit_head.py")
    arrays = load_file(str(directory / HEAD_FILE))
    coef, intercept = arrays["coef"].float(), arrays["intercept"].float()
    setfit = json.loads((directory / SETFIT_CONFIG).read_text()) if (directory / SETFIT_CONFIG).exists() else {}
    if coef.shape[0] == 1:  # binary: label 0 scores 0
        coef, intercept = torch.cat([torch.zeros_like(coef), coef]), torch.cat([torch.zeros_like(intercept), intercept])
    labels = setfit.get("labels") or [str(i) for i in range(coef.shape[0])]
    if len(labels) != coef.shape[0] or intercept.shape != (coef.shape[0],):
        raise ValueError(f"{directory / HEAD_FILE}: coef {tuple(arrays['coef'].shape)}, intercept "
                         f"{tuple(arrays['intercept'].shape)} and {len(labels)} labels do not agree")
    head = nn.Linear(coef.shape[1], coef.shape[0])
    with torch.no_grad():
        head.weight.copy_(coef)
        head.bias.copy_(intercept)
    return head, [str(label) for label in labels], bool(setfit.get("normalize_embeddings", False))


def save_linear_head(directory: Path, coef, intercept, labels: list[str], normalize_embeddings: bool) -> None:
    """Writes the layout above (e.g. from a fitted scikit-learn LogisticRegression's
    coef_ and intercept_) into a sentence-transformers directory."""
    save_file({"coef": torch.as_tensor(coef, dtype=torch.float32).contiguous(),
               "intercept": torch.as_tensor(intercept, dtype=torch.float32).contiguous()},
              str(directory / HEAD_FILE))
    (directory / SETFIT_CONFIG).write_text(json.dumps(
        {"labels": list(labels), "normalize_embeddings": normalize_embeddings}, indent=1))
