"""Wire models of the pooling routes, from the flat OpenAPI file in shared/spec:
`POST /classify` (`ContainerTextClassificationBody`, `TextClassificationResult`) and
`POST /v1/embeddings` on the container, with the body and response of the dedicated
embeddings operation (`DedicatedEmbeddingsBody`, `DedicatedEmbeddingsSuccess`;
`model` optional here, as on every container route).
"""

from typing import Literal

from pydantic import model_validator

from amity.server.schemas import RequestModel, ResponseModel, TokenId, Usage


class PoolingBody(RequestModel):
    """Exactly one of `input` (a text, or a list of texts answered in order) and `tokens`."""

    model: str | None = None
    input: str | list[str] | None = None
    tokens: list[TokenId] | None = None

    @model_validator(mode="after")
    def _input_xor_tokens(self):
        if self.input is None and self.tokens is None:
            raise ValueError("give either `input` (a text or a list of texts) or `tokens` (token ids)")
        if self.input is not None and self.tokens is not None:
            raise ValueError("give only one of `input` and `tokens`, not both")
        if isinstance(self.input, list) and not self.input:
            raise ValueError("`input` is an empty list; give at least one text")
        return self


class EmbeddingsBody(PoolingBody):
    encoding_format: Literal["float", "base64"] | None = "float"


class EmbeddingObject(ResponseModel):
    index: int
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str  # base64: little-endian float32


class EmbeddingsSuccess(ResponseModel):
    id: str
    model: str | None = None
    object: Literal["list"] = "list"
    data: list[EmbeddingObject]
    usage: Usage
    created: int


class ClassificationData(ResponseModel):
    index: int
    label: str
    num_classes: int
    probs: list[float]  # softmax probabilities in label-id order


class ClassificationUsage(ResponseModel):
    prompt_tokens: int
    total_tokens: int


class ClassificationSuccess(ResponseModel):
    data: list[ClassificationData]
    object: Literal["list"] = "list"
    usage: ClassificationUsage
