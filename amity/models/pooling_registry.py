"""Which network runs a pooling checkpoint: by `config.architectures` for a Hugging
Face directory, by `config.model_type` for a sentence-transformers body (it is
loaded as transformers' AutoModel would, whatever head its config names)."""

from amity.models.bert import BertModel, DistilBertModel, RobertaModel
from amity.models.decoder_classifier import (LlamaForSequenceClassification, Qwen2ForSequenceClassification,
                                             Qwen3ForSequenceClassification)
from amity.models.encoder_classifier import (BertForSequenceClassification, DistilBertForSequenceClassification,
                                             RobertaForSequenceClassification)

ENCODER_ARCHITECTURES = {
    "BertModel": BertModel,
    "RobertaModel": RobertaModel,
    "XLMRobertaModel": RobertaModel,
    "DistilBertModel": DistilBertModel,
}
CLASSIFIER_ARCHITECTURES = {
    "BertForSequenceClassification": BertForSequenceClassification,
    "RobertaForSequenceClassification": RobertaForSequenceClassification,
    "XLMRobertaForSequenceClassification": RobertaForSequenceClassification,
    "DistilBertForSequenceClassification": DistilBertForSequenceClassification,
    "LlamaForSequenceClassification": LlamaForSequenceClassification,
    "MistralForSequenceClassification": LlamaForSequenceClassification,
    "Qwen2ForSequenceClassification": Qwen2ForSequenceClassification,
    "Qwen3ForSequenceClassification": Qwen3ForSequenceClassification,
}
# model_type -> (body, the prefix a task-head checkpoint puts before the body's names)
SENTENCE_TRANSFORMER_BODIES = {
    "bert": (BertModel, "bert."),
    "roberta": (RobertaModel, "roberta."),
    "xlm-roberta": (RobertaModel, "roberta."),
    "distilbert": (DistilBertModel, "distilbert."),
}


def pooling_network_class(config) -> type:
    architectures = getattr(config, "architectures", None) or []
    for name in architectures:
        if name in CLASSIFIER_ARCHITECTURES:
            return CLASSIFIER_ARCHITECTURES[name]
        if name in ENCODER_ARCHITECTURES:
            return ENCODER_ARCHITECTURES[name]
    raise ValueError(f"unsupported pooling architecture {architectures or '(none given)'}; supported: "
                     f"{', '.join(sorted({**ENCODER_ARCHITECTURES, **CLASSIFIER_ARCHITECTURES}))}")
