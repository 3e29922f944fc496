"""Each `--quantization` scheme against the float32 path on the same weights:
teacher-forced logits over three ~700-token texts (the GPL-3, a Python source file
of amity, amity's README), KL(float32 || scheme) per position and how often the
argmax agrees. Prints one JSON line per scheme and text.

    .venv/bin/python benchmarks/accuracy.py --schemes auto bf16 bf16-weight int4

`auto` is what the server runs by default (on the default model: its Q4_1 and Q8_0
blocks); `--dtype`, `--kv-cache-dtype` and `--prompt-tiles` apply to the schemes, the
reference is always float32 throughout. The text goes in as one token of prompt and
the rest as forced output (so that every position gives logits): every position but
the first takes the path of generated tokens. `--as-prompt` computes every position
as a prompt position instead (models/prompt_rows.py's mask set for every row), so on
a CPU with AMX it measures what prompts get under `--prompt-tiles auto` (the block
layers' and attention's tiles) against `off`:

    .venv/bin/python benchmarks/accuracy.py --schemes auto --prompt-tiles auto off --as-prompt
"""

import argparse
import copy
import itertools
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `tests` is not installed: run as a script from anywhere

from amity.config import EngineConfig  # noqa: E402
from amity.engine.llm_engine import LLMEngine  # noqa: E402
from amity.models.loader import load_model  # noqa: E402
from tests.models.test_parity import engine_logits  # noqa: E402
TEXTS = {"GPL-3": Path("/usr/share/common-licenses/GPL-3"), "Python": ROOT / "amity" / "engine" / "scheduler.py",
         "README": ROOT / "README.md"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schemes", nargs="+", default=["auto", "bf16", "bf16-weight", "int8-weight", "int4"])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--tokens", type=int, default=700)
    parser.add_argument("--kv-cache-dtype", nargs="+", default=["auto"],
                        help="each scheme runs once per KV cache dtype listed (auto, float32, bfloat16)")
    parser.add_argument("--prompt-tiles", nargs="+", default=["auto"], help="and once per setting listed")
    parser.add_argument("--as-prompt", action="store_true", help="every position computed as a prompt position")
    args = parser.parse_args()
    loaded = load_model(args.model, torch.float32, torch.device("cpu"))
    texts = {name: loaded.tokenizer.encode(path.read_text())[:args.tokens]
             for name, path in TEXTS.items() if path.exists()}
    config = dict(model=args.model, kv_cache_memory="256MiB", max_num_batched_tokens=4096)
    reference_engine = LLMEngine(EngineConfig(dtype="float32", **config), copy.deepcopy(loaded))
    references = {name: engine_logits(reference_engine, ids).log_softmax(-1) for name, ids in texts.items()}
    for scheme, kv_cache_dtype, prompt_tiles in itertools.product(args.schemes, args.kv_cache_dtype,
                                                                  args.prompt_tiles):
        engine = LLMEngine(EngineConfig(dtype=args.dtype, quantization=scheme, kv_cache_dtype=kv_cache_dtype,
                                        prompt_tiles=prompt_tiles, **config), copy.deepcopy(loaded))
        rows = engine.runner.prompt_rows
        if args.as_prompt and rows is not None:
            set_step = rows.set_step
            rows.set_step = lambda prompt_rows: set_step(torch.ones_like(prompt_rows))
        for name, ids in texts.items():
            reference, logprobs = references[name], engine_logits(engine, ids).float().log_softmax(-1)
            kl = (reference.exp() * (reference - logprobs)).sum(-1).mean().item()
            agree = (reference.argmax(-1) == logprobs.argmax(-1)).float().mean().item()
            print(json.dumps({"scheme": scheme, "kv_cache": str(engine.kv_cache_dtype).removeprefix("torch."),
                              "prompt_tiles": engine.prompt_tiles, "as_prompt": args.as_prompt,
                              "text": name, "tokens": len(ids), "kl": round(kl, 6),
                              "argmax_agreement": round(agree, 4)}), flush=True)


if __name__ == "__main__":
    main()
