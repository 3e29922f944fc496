"""The embedding container, over HTTP (the Suite never imports the engine):
`/v1/embeddings` embeds chunks and queries, `/v1/tokenize` counts tokens for the
chunker, `/v1/models` names the model. Vectors come back as base64 float32 and are
scaled to unit length, so a dot product is the cosine similarity."""

import base64
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

EMBED_BATCH = 32
TOKENIZE_THREADS = 4
TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=60.0, pool=60.0)


class EmbedderError(Exception):
    """The embedding container is missing, unreachable, or refused a request."""

    def __init__(self, status: int, msg: str):
        super().__init__(msg)
        self.status = status


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


class Embedder:
    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, timeout=TIMEOUT, trust_env=False)
        self._model: str | None = None
        self._special_tokens: int | None = None

    def _post(self, path: str, body: dict) -> dict:
        try:
            response = self.http.post(path, json=body)
        except httpx.HTTPError as error:
            raise EmbedderError(502, f"the embedding container at {self.base_url} cannot be "
                                     f"reached: {error}") from None
        if response.status_code != 200:
            raise EmbedderError(502, f"the embedding container answered {path} with "
                                     f"{response.status_code}: {response.text[:500]}")
        return response.json()

    @property
    def model(self) -> str:
        if self._model is None:
            try:
                listed = self.http.get("/v1/models").json()["data"]
            except (httpx.HTTPError, ValueError, KeyError) as error:
                raise EmbedderError(502, f"the embedding container at {self.base_url} does not "
                                         f"list its model: {error}") from None
            self._model = listed[0]["id"]
        return self._model

    def _tokens(self, text: str) -> int:
        return len(self._post("/v1/tokenize", {"prompt": text})["tokens"])

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens of each text without the tokenizer's special ones ([CLS], [SEP])."""
        if self._special_tokens is None:
            self._special_tokens = self._tokens("")
        with ThreadPoolExecutor(TOKENIZE_THREADS) as pool:
            return [n - self._special_tokens for n in pool.map(self._tokens, texts)]

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit-length float32 rows, one per text."""
        rows = []
        for i in range(0, len(texts), EMBED_BATCH):
            answer = self._post("/v1/embeddings", {"input": texts[i:i + EMBED_BATCH],
                                                   "encoding_format": "base64"})
            data = sorted(answer["data"], key=lambda d: d["index"])
            rows += [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data]
        return unit_rows(np.stack(rows))

    def close(self) -> None:
        self.http.close()
