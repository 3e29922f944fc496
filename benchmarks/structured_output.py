"""Structured output (issue 5): the grammar library's figures, and decode throughput
with a JSON-schema constraint versus without at batch 1 and 16. Target: the
constraint costs under 10% of the unconstrained throughput at batch 16.

    .venv/bin/python benchmarks/structured_output.py            # library + throughput
    .venv/bin/python benchmarks/structured_output.py --libraries xgrammar llguidance outlines-core

Library figures (`--libraries`; each candidate that is installed is measured): the
compile time of NESTED (nested objects, a $ref, enums, bounded arrays, a format),
the time to compute the next-token mask at each of the 79-96 tokens of a valid
document on SmolLM2's 49,152-token vocabulary, and which of FEATURES compile.
Measured on this project's 2-core CPU box (shared, so noisy), 2026-05:

    library        compile   mask/token mean  p50     p99      max     features
    xgrammar 0.2.9   71 ms     6 us            1 us    44 us    130 us  20/21 compile*
    llguidance 1.9.1  3 ms**  148 us           15 us  3531 us   5828 us  16/21
    outlines-core 0.2.14 1894 ms  86 us          1 us   858 us   3465 us  18/21
    *  xgrammar accepts but does not enforce `not`, `if`/`then`, `dependentRequired`
       (and approximates overlapping `oneOf`): amity refuses those with a 422
       (structured_output.UNSUPPORTED_KEYWORDS) so that every output validates.
    ** llguidance compiles lazily: its cost lands in the first masks (the p99).

xgrammar was chosen: by far the cheapest mask, a compile that is cached per schema
anyway, and the widest coverage. Throughput (this script's second part) is printed
as tokens/s of decode steps in which every request of the batch is still decoding.
"""

import argparse
import json
import statistics
import time

NESTED = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {"type": "object", "properties": {
            "street": {"type": "string"}, "city": {"type": "string"},
            "geo": {"type": "object", "properties": {"lat": {"type": "number"},
                                                     "lon": {"type": "number"}},
                    "required": ["lat", "lon"]}},
            "required": ["street", "city", "geo"]},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "friends": {"type": "array", "items": {"$ref": "#/$defs/person"}, "maxItems": 2},
        "bio": {"type": "string"},
    },
    "required": ["name", "age", "role", "address", "tags", "bio"],
    "$defs": {"person": {"type": "object", "properties": {
        "name": {"type": "string"}, "email": {"type": "string", "format": "email"}},
        "required": ["name"]}},
}
DOC = {"name": "Ada Lovelace", "age": 36, "role": "admin",
       "address": {"street": "12 St James's Square", "city": "London",
                   "geo": {"lat": 51.5, "lon": -0.13}},
       "tags": ["math", "poetry"], "friends": [{"name": "Charles", "email": "cb@example.com"}],
       "bio": "Wrote the first program."}
FEATURES = {
    "format_email": {"type": "string", "format": "email"},
    "format_datetime": {"type": "string", "format": "date-time"},
    "pattern": {"type": "string", "pattern": "^[a-z]{3}[0-9]+$"},
    "anyOf": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    "oneOf": {"oneOf": [{"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"]},
                        {"type": "object", "properties": {"b": {"const": 2}}, "required": ["b"]}]},
    "allOf": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                        {"required": ["a"]}]},
    "recursive_ref": {"$defs": {"n": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
        "required": ["v"]}}, "$ref": "#/$defs/n"},
    "additionalProperties": {"type": "object", "additionalProperties": {"type": "integer"}},
    "minmaxLength": {"type": "string", "minLength": 2, "maxLength": 5},
    "int_bounds": {"type": "integer", "minimum": 3, "maximum": 17},
    "exclusiveMinimum": {"type": "number", "exclusiveMinimum": 0},
    "multipleOf": {"type": "integer", "multipleOf": 5},
    "uniqueItems": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
    "minProperties": {"type": "object", "minProperties": 1},
    "patternProperties": {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
    "const": {"const": "hi"},
    "type_array": {"type": ["string", "null"]},
    "prefixItems": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
    "not": {"not": {"type": "string"}},
    "if_then": {"if": {"type": "integer"}, "then": {"minimum": 1}},
    "dependentRequired": {"type": "object", "properties": {"a": {"type": "integer"}},
                          "dependentRequired": {"a": ["b"]}},
}


def _pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _report(name, compile_s, mask_s, features):
    us = [t * 1e6 for t in mask_s]
    ok = [f for f, good in features.items() if good]
    print(f"{name:>14}: compile {compile_s * 1e3:7.1f} ms | mask/token mean {statistics.mean(us):6.0f} us "
          f"p50 {_pct(us, .5):5.0f} p99 {_pct(us, .99):6.0f} max {max(us):6.0f} us | features "
          f"{len(ok)}/{len(features)} (refused: {sorted(set(features) - set(ok))})")


def bench_library(name, hf, vocab_size):
    import torch

    compact = hf.encode(json.dumps(DOC, separators=(",", ":")), add_special_tokens=False)
    spaced = hf.encode(json.dumps(DOC), add_special_tokens=False)
    if name == "xgrammar":
        import xgrammar as xgr
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size)
        comp = xgr.GrammarCompiler(info, cache_enabled=False)
        bitmask = xgr.allocate_token_bitmask(1, vocab_size)

        def compile_(schema):
            return comp.compile_json_schema(json.dumps(schema), any_whitespace=False)
        make, ids = xgr.GrammarMatcher, spaced
        fill = lambda m: m.fill_next_token_bitmask(bitmask, 0)  # noqa: E731
        accept = lambda m, t: m.accept_token(t)  # noqa: E731
    elif name == "llguidance":
        import llguidance
        import llguidance.hf
        import llguidance.torch as lgt
        tok = llguidance.hf.from_tokenizer(hf, n_vocab=vocab_size)
        bitmask = lgt.allocate_token_bitmask(1, tok.vocab_size)

        def compile_(schema):
            g = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(schema), defaults={"whitespace_flexible": False})
            m = llguidance.LLMatcher(tok, g)
            if m.is_error():
                raise ValueError(m.get_error())
            return g
        make, ids = (lambda g: llguidance.LLMatcher(tok, g)), compact
        fill = lambda m: lgt.fill_next_token_bitmask(m, bitmask, 0)  # noqa: E731
        accept = lambda m, t: m.consume_token(t)  # noqa: E731
    else:
        from outlines_core import Guide, Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema
        eos = hf.eos_token_id
        vocab: dict[str, list[int]] = {}
        for t in range(len(hf)):
            if t != eos:
                vocab.setdefault(hf.convert_ids_to_tokens(t), []).append(t)
        voc = Vocabulary(eos, vocab)
        mask = torch.zeros((vocab_size + 31) // 32, dtype=torch.int32)

        def compile_(schema):
            return Index(build_regex_from_schema(json.dumps(schema)), voc)
        make, ids = Guide, compact
        fill = lambda m: m.write_mask_into(mask.data_ptr(), mask.numel(), 4)  # noqa: E731

        def accept(m, t):
            m.advance(t)
            return True
    start = time.perf_counter()
    grammar = compile_(NESTED)
    compile_s = time.perf_counter() - start
    matcher, mask_s = make(grammar), []
    for t in ids + [None]:
        start = time.perf_counter()
        fill(matcher)
        mask_s.append(time.perf_counter() - start)
        if t is not None:
            assert accept(matcher, t), (name, t)
    features = {}
    for fname, schema in FEATURES.items():
        try:
            compile_(schema)
            features[fname] = True
        except Exception:
            features[fname] = False
    _report(name, compile_s, mask_s, features)


def throughput(engine, batch: int, output_len: int, constrained: bool, rounds: int) -> float:
    """Median over rounds of decode tokens/s, over steps where all `batch` decode."""
    from amity.engine.sampling_params import SamplingParams
    from amity.engine.structured_output import StructuredOutputSpec

    tok = engine.tokenizer
    prompt = tok.encode(tok.apply_chat_template([
        {"role": "system", "content": "You are an API generating valid JSON as output."},
        {"role": "user", "content": "Describe a famous scientist."}]))
    spec = StructuredOutputSpec("json_schema", NESTED) if constrained else None
    rates = []
    for r in range(rounds):
        for i in range(batch):
            engine.add_request(f"b{batch}-{constrained}-{r}-{i}", prompt, SamplingParams(
                temperature=1.0, seed=1000 * r + i, max_tokens=output_len,
                eos_token=None if constrained else [], structured_output=spec))
        while engine.scheduler.waiting or any(
                q.num_computed_tokens < q.num_prompt_tokens for q in engine.scheduler.running):
            engine.step()
        tokens, elapsed = 0, 0.0
        while engine.has_unfinished_requests():
            full = len(engine.scheduler.running) == batch
            start = time.perf_counter()
            outs = engine.step()
            took = time.perf_counter() - start
            if full and all(o.finished is False for o in outs):
                tokens += sum(len(c.new_token_ids) for o in outs for c in o.outputs)
                elapsed += took
        if elapsed:
            rates.append(tokens / elapsed)
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--libraries", nargs="*", default=["xgrammar"],
                    help="grammar libraries to measure (those installed)")
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 16])
    ap.add_argument("--output-len", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()

    from amity.models.loader import default_model_path
    from amity.models.tokenizer import Tokenizer
    hf = Tokenizer.from_path(default_model_path()).hf
    for lib in args.libraries:
        try:
            bench_library(lib, hf, len(hf))
        except ImportError as err:
            print(f"{lib:>14}: not installed ({err})")
    if args.skip_throughput:
        return
    from amity.config import EngineConfig
    from amity.engine.llm_engine import LLMEngine
    engine = LLMEngine(EngineConfig(max_model_len=2048))
    throughput(engine, 2, 8, True, 1)  # warm-up, and the schema's compile
    for batch in args.batches:
        plain, constrained = [], []
        for _ in range(2):  # interleaved, so load changes hit both alike
            plain.append(throughput(engine, batch, args.output_len, False, args.rounds))
            constrained.append(throughput(engine, batch, args.output_len, True, args.rounds))
        p, c = max(plain), max(constrained)
        print(f"batch {batch:>3}: unconstrained {p:7.1f} tok/s | json_schema {c:7.1f} tok/s | "
              f"cost {100 * (1 - c / p):5.1f}%")


if __name__ == "__main__":
    main()
