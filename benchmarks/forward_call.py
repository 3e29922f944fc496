"""The compiled forward's own cost per call: a one-token step on a 30-layer tiny Llama.

The tiny model (hidden size 64, tests/conftest.py's, with 30 layers as the default model
has) computes in tens of microseconds, so what a call costs is mostly dynamo's guards,
the code that hands the inputs to the graph and the graph's wrapper: what a decode step
pays on top of its compute. One torch thread. Build the model once, then time each
source tree in its own process, alternating:

    PY=/work/main/.venv/bin/python; export TORCH_EXTENSIONS_DIR=/work/ext
    PYTHONPATH=$PWD $PY benchmarks/forward_call.py /tmp/tiny30 --build
    for i in 1 2 3; do for tree in /work/main $PWD; do
        PYTHONPATH=$tree $PY $PWD/benchmarks/forward_call.py /tmp/tiny30; done; done
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

NUM_LAYERS = 30
CALLS = 200
ROUNDS = 15


def build(directory: Path) -> None:
    from tests import conftest

    tiny_config = conftest._tiny_config

    def with_layers(arch, vocab_size):
        config = tiny_config(arch, vocab_size)
        config.num_hidden_layers = NUM_LAYERS
        return config

    conftest._tiny_config = with_layers
    (directory / "tokenizer").mkdir(parents=True, exist_ok=True)
    conftest._build_tokenizer(directory / "tokenizer")
    conftest.build_tiny_model("llama", directory / "model", directory / "tokenizer")


def time_calls(directory: Path) -> dict:
    from amity.config import EngineConfig
    from amity.engine.llm_engine import LLMEngine
    from amity.models.attention import AttentionMetadata

    engine = LLMEngine(EngineConfig(model=str(directory / "model"), dtype="float32", kv_cache_memory="16MiB",
                                    block_size=16, num_threads=1, compile="true"))
    # The tree's KV cache as its model takes it: one tensor, or (before) a list of pairs.
    kv_cache = engine.kv_cache if hasattr(engine, "kv_cache") else engine.kv_caches
    with torch.inference_mode():  # as ModelRunner.execute
        ids = torch.tensor([5])
        meta = AttentionMetadata(slot_mapping=torch.tensor([5]), query_start=torch.tensor([0, 1]),
                                 context_lens=torch.tensor([6]), block_tables=torch.zeros((1, 1), dtype=torch.long))
        embeds = engine.model.embed(ids)
        call_us = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            for _ in range(CALLS):
                engine.runner.forward(embeds, ids.clone(), kv_cache, meta)
            call_us.append((time.perf_counter() - started) / CALLS * 1e6)
    return {"call_us": round(statistics.median(call_us), 1), "min_us": round(min(call_us), 1),
            "load_avg": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path, help="where the tiny model is (or goes, with --build)")
    parser.add_argument("--build", action="store_true", help="build the 30-layer tiny model there")
    args = parser.parse_args()
    if args.build:
        build(args.directory)
    else:
        print(json.dumps({"tree": os.environ.get("PYTHONPATH"), **time_calls(args.directory)}))


if __name__ == "__main__":
    main()
