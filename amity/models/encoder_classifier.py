"""Sequence classifiers on the BERT family (bert.py), each with its own head layout,
as in the Hugging Face checkpoints, all reading the first token's hidden state:

- `BertForSequenceClassification`: classifier(tanh(bert.pooler.dense(h)))
- `RobertaForSequenceClassification` (and XLM-R's): classifier.out_proj(tanh(classifier.dense(h)))
- `DistilBertForSequenceClassification`: classifier(relu(pre_classifier(h)))

(Dropout is the identity at inference.)
"""

import torch
from torch import nn

from amity.models.bert import BertModel, DistilBertModel, RobertaModel, distilbert_checkpoint_name
from amity.models.packed_batch import PackedBatch


class BertForSequenceClassification(nn.Module):
    default_pooling = "cls"
    max_sequence_len = BertModel.max_sequence_len

    def __init__(self, config):
        super().__init__()
        self.bert = BertModel(config, add_pooler=True)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        return self.bert.hidden_states(batch)

    def logits(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.bert.pooler(pooled))


class RobertaClassificationHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, first_token: torch.Tensor) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(first_token)))


class RobertaForSequenceClassification(nn.Module):
    default_pooling = "cls"
    max_sequence_len = RobertaModel.max_sequence_len

    def __init__(self, config):
        super().__init__()
        self.roberta = RobertaModel(config)
        self.classifier = RobertaClassificationHead(config)

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        return self.roberta.hidden_states(batch)

    def logits(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(pooled)


class DistilBertForSequenceClassification(nn.Module):
    default_pooling = "cls"
    max_sequence_len = DistilBertModel.max_sequence_len
    checkpoint_name = staticmethod(distilbert_checkpoint_name)

    def __init__(self, config):
        super().__init__()
        self.distilbert = DistilBertModel(config)
        self.pre_classifier = nn.Linear(config.dim, config.dim)
        self.classifier = nn.Linear(config.dim, config.num_labels)

    def hidden_states(self, batch: PackedBatch) -> torch.Tensor:
        return self.distilbert.hidden_states(batch)

    def logits(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.relu(self.pre_classifier(pooled)))
