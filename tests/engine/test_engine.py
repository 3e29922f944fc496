"""LLMEngine end to end on a tiny random-weight Llama (hidden 64, 2 layers).

The reference for every scheduling scenario is the same prompt run alone on an
engine with no prefix caching and no budget pressure: batching, chunking, prefix
hits, eviction and preemption must not change a single greedy token.
"""

import dataclasses
import random
import time

import pytest
import torch
import transformers

from amity.config import EngineConfig
from amity.engine.errors import RequestError
from amity.engine.llm_engine import LLMEngine
from amity.engine.outputs import FinalOutput
from amity.engine.request import RequestStatus
from amity.engine.sampling_params import SamplingParams
from amity.models.loader import load_model

GREEDY = dict(temperature=0.0, eos_token=[])  # no EOS: random weights would stop at random


@pytest.fixture(scope="module")
def loaded(tiny_llama_path):
    return load_model(tiny_llama_path, torch.float32, torch.device("cpu"))


@pytest.fixture(scope="module")
def make_engine(tiny_llama_path, loaded):
    def make(**overrides) -> LLMEngine:
        config = dict(model=str(tiny_llama_path), dtype="float32", kv_cache_memory="16MiB",
                      block_size=8, max_num_seqs=16, max_num_batched_tokens=512, num_threads=1)
        config.update(overrides)
        return LLMEngine(EngineConfig(**config), loaded=loaded)
    return make


@pytest.fixture(scope="module")
def vocab_size(loaded):
    return loaded.config.vocab_size


def prompts(n: int, lengths, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, vocab) for _ in range(lengths[i % len(lengths)])] for i in range(n)]


@pytest.fixture(scope="module")
def alone(make_engine):
    """Greedy tokens of one prompt run by itself: the reference."""
    engine = make_engine(enable_prefix_caching=False)
    cache: dict = {}

    def run(prompt: list[int], max_tokens: int) -> list[int]:
        key = (tuple(prompt), max_tokens)
        if key not in cache:
            (out,) = engine.generate([prompt], SamplingParams(max_tokens=max_tokens, **GREEDY))
            cache[key] = out.ordered_choices[0].token_ids
            assert len(cache[key]) == max_tokens
        return cache[key]
    return run


def run_arrivals(engine: LLMEngine, arrivals: dict[int, list[tuple[str, list[int], SamplingParams]]],
                 on_step=None) -> dict[str, list[int]]:
    """Add requests at the given step numbers and run until all finish."""
    tokens: dict[str, list[int]] = {}
    step = 0
    while step <= max(arrivals) or engine.has_unfinished_requests():
        for rid, prompt, params in arrivals.get(step, []):
            engine.add_request(rid, prompt, params)
            tokens[rid] = []
        for out in engine.step():
            for c in out.outputs:
                tokens[out.request_id].extend(c.new_token_ids)
        if on_step:
            on_step(engine)
        step += 1
        assert step < 2000
    return tokens


def assert_all_blocks_free(engine: LLMEngine) -> None:
    stats = engine.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0


def test_batching_changes_nothing(make_engine, alone, vocab_size):
    ps = prompts(8, [3, 17, 40, 1, 25, 9, 64, 12], vocab_size, seed=1)
    max_tokens = [20, 7, 15, 24, 3, 18, 10, 22]
    engine = make_engine(block_size=4)
    # Different lengths, arriving at different steps, in the middle of others' decodes.
    arrival_steps = [0, 0, 2, 3, 3, 7, 11, 12]
    arrivals: dict = {}
    for i, (p, m, s) in enumerate(zip(ps, max_tokens, arrival_steps)):
        arrivals.setdefault(s, []).append((f"r{i}", p, SamplingParams(max_tokens=m, **GREEDY)))
    got = run_arrivals(engine, arrivals)
    for i, (p, m) in enumerate(zip(ps, max_tokens)):
        assert got[f"r{i}"] == alone(p, m), f"request r{i} (prompt {len(p)} tokens) changed"
    assert_all_blocks_free(engine)


def test_chunked_prefill_changes_nothing(make_engine, alone, vocab_size):
    ps = prompts(4, [45, 30, 6, 61], vocab_size, seed=2)
    engine = make_engine(max_num_batched_tokens=8)
    arrivals = {0: [(f"r{i}", p, SamplingParams(max_tokens=12, **GREEDY)) for i, p in enumerate(ps[:2])],
                5: [(f"r{i}", p, SamplingParams(max_tokens=12, **GREEDY)) for i, p in enumerate(ps[2:], 2)]}
    got = run_arrivals(engine, arrivals)
    for i, p in enumerate(ps):
        assert got[f"r{i}"] == alone(p, 12)
    # 142 prompt tokens + 4 x 11 decode tokens at 8 per step: the budget held.
    assert engine.num_steps >= (142 + 44) // 8
    assert_all_blocks_free(engine)


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "int8"])
def test_a_narrower_kv_cache_changes_nothing_between_batches_and_chunks(make_engine, vocab_size, kv_cache_dtype):
    # `--kv-cache-dtype bfloat16` or `int8` on a float32 model: K/V rounded (quantized)
    # once as written, so a request's tokens do not depend on its batch or its chunks either.
    ps = prompts(4, [45, 30, 6, 61], vocab_size, seed=2)
    reference = make_engine(kv_cache_dtype=kv_cache_dtype, enable_prefix_caching=False)
    assert reference.kv_cache.dtype == getattr(torch, kv_cache_dtype)
    alone = [reference.generate([p], SamplingParams(max_tokens=12, **GREEDY))[0].ordered_choices[0].token_ids
             for p in ps]
    engine = make_engine(kv_cache_dtype=kv_cache_dtype, max_num_batched_tokens=8, block_size=4)
    arrivals = {0: [(f"r{i}", p, SamplingParams(max_tokens=12, **GREEDY)) for i, p in enumerate(ps[:2])],
                3: [(f"r{i}", p, SamplingParams(max_tokens=12, **GREEDY)) for i, p in enumerate(ps[2:], 2)]}
    got = run_arrivals(engine, arrivals)
    assert [got[f"r{i}"] for i in range(len(ps))] == alone
    assert_all_blocks_free(engine)


def test_the_kv_cache_dtype_by_default_and_on_request():
    from torch import nn

    from amity.models.dtype import resolve_kv_cache_dtype
    from amity.models.quantization import quantize_model, weight_storage

    # auto follows the weights: float32 ones keep float32 K/V, bfloat16 ones bfloat16,
    # integer ones (file blocks, int8, int4) int8.
    assert resolve_kv_cache_dtype("auto", torch.float32, "float32") == torch.float32
    assert resolve_kv_cache_dtype("auto", torch.float32, "16-bit") == torch.bfloat16
    assert resolve_kv_cache_dtype("auto", torch.float32, "integer") == torch.int8
    assert resolve_kv_cache_dtype("auto", torch.bfloat16, "16-bit") == torch.bfloat16
    assert resolve_kv_cache_dtype("auto", torch.bfloat16, "float32") == torch.bfloat16
    assert resolve_kv_cache_dtype("float32", torch.float32, "integer") == torch.float32
    assert resolve_kv_cache_dtype("bfloat16", torch.float32, "float32") == torch.bfloat16
    assert resolve_kv_cache_dtype("float16", torch.float32, "float32") == torch.float16
    assert resolve_kv_cache_dtype("int8", torch.float32, "float32") == torch.int8
    with pytest.raises(ValueError, match="keeps K/V in its own dtype"):
        resolve_kv_cache_dtype("float32", torch.bfloat16, "float32")
    cpu = torch.device("cpu")
    layers = {scheme: quantize_model(nn.Sequential(nn.Linear(64, 32)), scheme, cpu)
              for scheme in ("none", "auto", "bf16-weight", "int8", "int4")}
    assert {scheme: weight_storage(model) for scheme, model in layers.items()} == {
        "none": "float32", "auto": "float32", "bf16-weight": "16-bit", "int8": "integer", "int4": "integer"}


def test_prefix_cache_hit_reports_cached_tokens_and_same_output(make_engine, alone, vocab_size):
    engine = make_engine(block_size=8)
    (base,) = prompts(1, [37], vocab_size, seed=3)
    other = prompts(1, [9], vocab_size, seed=4)[0]
    params = SamplingParams(max_tokens=10, **GREEDY)
    (first,) = engine.generate([base], params)
    assert first.num_cached_tokens == 0
    assert first.ordered_choices[0].token_ids == alone(base, 10)

    shared = base[:27] + other  # 27 shared tokens: 3 full blocks of 8
    (second,) = engine.generate([shared], params)
    assert second.num_cached_tokens == 24
    assert second.ordered_choices[0].token_ids == alone(shared, 10)

    (same,) = engine.generate([base], params)  # 37 tokens: 4 full blocks
    assert same.num_cached_tokens == 32
    assert same.ordered_choices[0].token_ids == first.ordered_choices[0].token_ids
    assert engine.stats()["prefix_cache_hit_rate"] > 0
    assert_all_blocks_free(engine)


def test_prefix_cache_hit_on_a_running_request(make_engine, alone, vocab_size):
    engine = make_engine(block_size=8)
    base, tail = prompts(2, [24, 5], vocab_size, seed=5)
    p = SamplingParams(max_tokens=16, **GREEDY)
    finals = {}
    got = run_arrivals(engine, {0: [("a", base, p)], 3: [("b", base + tail, p)]},
                       on_step=lambda e: finals.update({k: r[0].num_cached_tokens
                                                        for k, r in e.groups.items()}))
    assert finals["b"] == 24  # a's prompt blocks, while a is still decoding
    assert got["a"] == alone(base, 16) and got["b"] == alone(base + tail, 16)


def test_eviction_under_memory_pressure(make_engine, alone, vocab_size):
    # 12 blocks of 4 tokens; 10 distinct 14-token prompts, 6 new tokens each (5 blocks).
    engine = make_engine(block_size=4, kv_cache_memory=str(12 * 2048))
    assert engine.num_blocks == 12
    ps = prompts(10, [14], vocab_size, seed=6)
    params = SamplingParams(max_tokens=6, **GREEDY)
    outs = engine.generate(ps[:5], params)  # five at once, then five more one by one
    for p, out in zip(ps, outs):
        assert out.ordered_choices[0].token_ids == alone(p, 6)
    for p in ps[5:]:
        (out,) = engine.generate([p], params)
        assert out.ordered_choices[0].token_ids == alone(p, 6)
        assert engine.stats()["num_cached_blocks"] <= 12
    # The first prompts' blocks were evicted, the last one's survive; both stay correct.
    (old,) = engine.generate([ps[0]], params)
    assert old.num_cached_tokens == 0
    assert old.ordered_choices[0].token_ids == alone(ps[0], 6)
    (recent,) = engine.generate([ps[9]], params)
    assert recent.num_cached_tokens == 12
    assert recent.ordered_choices[0].token_ids == alone(ps[9], 6)
    assert_all_blocks_free(engine)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_preemption_with_a_tiny_block_pool(make_engine, alone, vocab_size, prefix_caching):
    # 10 blocks of 4 = 40 token slots; 6 requests that each grow to 30-ish tokens.
    engine = make_engine(block_size=4, kv_cache_memory=str(10 * 2048),
                         enable_prefix_caching=prefix_caching)
    assert engine.num_blocks == 10
    ps = prompts(6, [10, 4, 13, 7, 16, 2], vocab_size, seed=7)
    max_tokens = [20, 24, 14, 18, 16, 26]
    arrivals = {0: [(f"r{i}", p, SamplingParams(max_tokens=m, **GREEDY))
                    for i, (p, m) in enumerate(zip(ps, max_tokens))]}
    preempted = set()

    def watch(e):
        preempted.update(r.request_id for r in e.scheduler.waiting
                         if r.status is RequestStatus.PREEMPTED)
    got = run_arrivals(engine, arrivals, on_step=watch)
    assert preempted, "the pool is too small for all six at once: something must be preempted"
    for i, (p, m) in enumerate(zip(ps, max_tokens)):
        assert got[f"r{i}"] == alone(p, m)
    assert_all_blocks_free(engine)


def test_abort_and_finish_return_every_block(make_engine, vocab_size):
    engine = make_engine(block_size=4, max_num_batched_tokens=16)
    total = engine.stats()["num_total_blocks"]
    ps = prompts(5, [30, 9, 12, 20, 5], vocab_size, seed=8)
    for i, p in enumerate(ps):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=30, **GREEDY))
    engine.add_request("shared", ps[1] + [1, 2, 3], SamplingParams(max_tokens=30, **GREEDY))
    for _ in range(3):
        engine.step()
    stats = engine.stats()
    assert stats["num_free_blocks"] < total and stats["num_waiting"] > 0
    r0, r1, r4 = (engine.groups[k][0] for k in ("r0", "r1", "r4"))
    assert r0.status is RequestStatus.RUNNING and r0.num_output_tokens > 0
    assert r4.status is RequestStatus.WAITING
    engine.abort_request("r0")  # mid generation
    engine.abort_request("r4")  # still waiting
    for _ in range(5):
        engine.step()
    assert r1.status is RequestStatus.RUNNING and r1.num_output_tokens > 0
    assert engine.groups["shared"][0].num_cached_tokens == 8
    engine.abort_request("r1")  # mid generation, its prefix blocks shared with "shared"
    engine.abort_request("no-such-request")  # harmless
    while engine.has_unfinished_requests():
        engine.step()
    assert_all_blocks_free(engine)
    # The engine's memory does not grow with the requests it has served.
    for round_ in range(3):
        engine.generate(prompts(6, [7, 11], vocab_size, seed=100 + round_),
                        SamplingParams(max_tokens=5, **GREEDY))
        assert_all_blocks_free(engine)
    assert engine.stats()["num_total_blocks"] == total


def test_outputs_say_how_long_the_request_waited_for_its_first_schedule(make_engine, vocab_size):
    engine = make_engine(max_num_seqs=1)
    first, second = prompts(2, [6, 6], vocab_size, seed=3)
    engine.add_request("a", first, SamplingParams(max_tokens=3, **GREEDY))
    engine.add_request("b", second, SamplingParams(max_tokens=3, **GREEDY))
    queued: dict[str, float | None] = {}
    before_steps = time.monotonic()  # after both arrived
    while engine.has_unfinished_requests():
        for out in engine.step():
            queued.setdefault(out.request_id, out.queued_seconds)
            assert out.queued_seconds == queued[out.request_id]  # fixed once scheduled
            if out.request_id == "a" and out.finished:
                a_done = time.monotonic()
    # b waited in the queue for all of a's steps (one sequence at a time): it arrived
    # before they began and was scheduled after they ended. (Not "longer than a": a
    # slow add_request of b can make a's own short wait the longer one.)
    assert queued["a"] is not None and queued["b"] is not None
    assert queued["a"] >= 0 and queued["b"] > a_done - before_steps > 0


def test_n_choices_with_seeds(make_engine, vocab_size):
    engine = make_engine(block_size=4)
    (p,) = prompts(1, [18], vocab_size, seed=9)
    params = SamplingParams(n=3, temperature=1.0, seed=[11, 22, 33], max_tokens=16, eos_token=[])
    engine.add_request("n3", p, params)
    group = list(engine.groups["n3"])  # the engine's per-choice requests
    out = FinalOutput("n3")
    while engine.has_unfinished_requests():
        for step_out in engine.step():
            out.add(step_out)
    choices = out.ordered_choices
    assert [c.index for c in choices] == [0, 1, 2]
    assert [c.seed for c in choices] == [11, 22, 33]
    assert all(len(c.token_ids) == 16 for c in choices)
    assert len({tuple(c.token_ids) for c in choices}) == 3  # different seeds, different samples
    # The prompt was computed once: choices 1 and 2 hit choice 0's 4 full blocks.
    assert [r.num_cached_tokens for r in group] == [0, 16, 16]
    # Each choice is what its seed gives alone, and a rerun reproduces them all.
    for c in choices:
        (single,) = engine.generate([p], SamplingParams(temperature=1.0, seed=c.seed, max_tokens=16,
                                                        eos_token=[]))
        assert single.ordered_choices[0].token_ids == c.token_ids
    (again,) = engine.generate([p], params)
    assert [c.token_ids for c in again.ordered_choices] == [c.token_ids for c in choices]
    # An int seed seeds choice i with seed + i.
    (by_int,) = engine.generate([p], SamplingParams(n=2, temperature=1.0, seed=21, max_tokens=16,
                                                    eos_token=[]))
    assert by_int.ordered_choices[1].token_ids == choices[1].token_ids
    assert_all_blocks_free(engine)


def test_prompt_plus_max_tokens_over_context_is_refused(make_engine, vocab_size):
    engine = make_engine()
    assert engine.max_model_len == 512
    (p,) = prompts(1, [500], vocab_size, seed=10)
    with pytest.raises(RequestError) as err:
        engine.add_request("too-long", p, SamplingParams(max_tokens=13, **GREEDY))
    assert "512" in str(err.value) and "max_tokens" in str(err.value)
    with pytest.raises(RequestError):
        engine.add_request("prompt-too-long", p + p[:12], SamplingParams(max_tokens=1, **GREEDY))
    # Nothing was queued; exactly at the limit is fine.
    assert not engine.has_unfinished_requests()
    (ok,) = engine.generate([p], SamplingParams(max_tokens=12, **GREEDY))
    assert len(ok.ordered_choices[0].token_ids) == 12


def test_stop_string_across_token_boundaries_is_never_emitted(make_engine, loaded, vocab_size):
    engine = make_engine()
    tok = loaded.tokenizer
    rng = random.Random(11)
    # Find a greedy continuation with two adjacent tokens that decode to plain text.
    for _ in range(50):
        p = tok.encode(" ".join(rng.choice(["the", "quick", "engine", "cache", "block", "fox", "world"])
                                for _ in range(6)))
        (full,) = engine.generate([p], SamplingParams(max_tokens=40, **GREEDY))
        ids = full.ordered_choices[0].token_ids
        pieces = [tok.decode([t]) for t in ids]
        for i in range(5, len(ids) - 1):
            a, b = pieces[i], pieces[i + 1]
            if len(a) >= 2 and len(b) >= 2 and (a + b).isascii() and (a + b).isprintable():
                break
        else:
            continue
        break
    else:
        pytest.skip("no continuation with two printable adjacent tokens")
    text = tok.decode(ids)
    stop = a[-2:] + b[:2]  # spans the boundary between token i and token i + 1
    cut = text.find(stop)
    assert cut != -1
    deltas = []
    engine.add_request("stop", p, SamplingParams(max_tokens=40, stop=[stop], **GREEDY))
    final_reason = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            for c in out.outputs:
                deltas.append(c.new_text)
                final_reason = c.finish_reason or final_reason
    streamed = "".join(deltas)
    assert stop not in streamed
    assert streamed == text[:cut]
    assert final_reason == "stop"


def test_forced_output_tokens_logprobs_match_transformers(make_engine, tiny_llama_path, vocab_size):
    engine = make_engine(block_size=4)
    prompt, forced = prompts(2, [11, 20], vocab_size, seed=12)
    (out,) = engine.generate([prompt], SamplingParams(forced_output_tokens=forced, logprobs=5, **GREEDY))
    choice = out.ordered_choices[0]
    assert choice.token_ids == forced
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_llama_path), dtype=torch.float32)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + forced])).logits[0].log_softmax(-1)[len(prompt) - 1:-1]
    ours = torch.tensor([lp.logprob for lp in choice.logprobs])
    expected = ref.gather(1, torch.tensor(forced)[:, None])[:, 0]
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    for lp, row in zip(choice.logprobs, ref):
        top = row.topk(5)
        assert [t for t, _ in lp.top] == top.indices.tolist()
        torch.testing.assert_close(torch.tensor([v for _, v in lp.top]), top.values, atol=1e-4, rtol=0)
    assert_all_blocks_free(engine)


def run_finals(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]],
               on_step=None) -> dict[str, FinalOutput]:
    """Add every request at once and run until all finish; their accumulated outputs."""
    finals = {}
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params)
        finals[rid] = FinalOutput(rid)
    for _ in range(2000):
        if not engine.has_unfinished_requests():
            return finals
        for out in engine.step():
            finals[out.request_id].add(out)
        if on_step:
            on_step(engine)
    raise AssertionError("requests still unfinished after 2000 steps")


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_forced_output_tokens_survive_preemption(make_engine, vocab_size, prefix_caching):
    """Issue 13 (defect 2): a forced request preempted midway through its pass
    scored its forced tokens again on recompute, overshot their count, never
    finished and held its blocks forever."""
    engine = make_engine(block_size=4, kv_cache_memory=str(10 * 2048), max_num_batched_tokens=8,
                         enable_prefix_caching=prefix_caching)
    assert engine.num_blocks == 10
    long_prompt, short_prompt, forced_prompt, forced = prompts(4, [4, 3, 6, 20], vocab_size, seed=13)
    forced_params = SamplingParams(forced_output_tokens=forced, logprobs=2, **GREEDY)
    (alone,) = make_engine().generate([forced_prompt], forced_params)
    requests = {"decode": (long_prompt, SamplingParams(max_tokens=30, **GREEDY)),
                "other": (short_prompt, SamplingParams(max_tokens=12, **GREEDY)),
                "forced": (forced_prompt, forced_params)}
    preempted = set()
    finals = run_finals(engine, requests, on_step=lambda e: preempted.update(
        r.group_id for r in e.scheduler.waiting if r.status is RequestStatus.PREEMPTED))
    assert "forced" in preempted, "the forced request must be preempted midway for this test"
    choice = finals["forced"].ordered_choices[0]
    assert choice.token_ids == forced and choice.finish_reason == "stop"
    expected = alone.ordered_choices[0].logprobs
    torch.testing.assert_close([lp.logprob for lp in choice.logprobs], [lp.logprob for lp in expected],
                               atol=1e-4, rtol=0)  # chunked differently: float rounding
    assert_all_blocks_free(engine)


def test_forced_output_tokens_with_n_choices_sharing_the_prompt(make_engine, vocab_size):
    """Issue 13 (defect 2): the second choice took its sibling's cached blocks,
    which cover forced positions, so it never computed (nor scored) them and
    never finished. Positions still owing an output are never taken from the cache."""
    engine = make_engine(block_size=4)
    prompt, forced = prompts(2, [11, 20], vocab_size, seed=14)
    finals = run_finals(engine, {"n2": (prompt, SamplingParams(n=2, forced_output_tokens=forced, **GREEDY))})
    assert [c.token_ids for c in finals["n2"].ordered_choices] == [forced, forced]
    assert [c.finish_reason for c in finals["n2"].ordered_choices] == ["stop", "stop"]
    assert_all_blocks_free(engine)


def test_out_of_range_seeds_are_refused_naming_the_field(make_engine, vocab_size):
    """Issue 13 (defect 1): `n: 2, seed: 2^64 - 1` seeded choice 1 with 2^64, which
    torch's generator refuses, after choice 0 was already queued: the orphan broke
    every later step. Seeds are checked up front, as a RequestError on `seed`."""
    engine = make_engine()
    (p,) = prompts(1, [5], vocab_size, seed=15)
    top = 2 ** 64 - 1
    for params in (SamplingParams(n=2, temperature=1.0, seed=top, max_tokens=3),
                   SamplingParams(n=2, temperature=0.0, seed=top, max_tokens=3),  # greedy too
                   SamplingParams(n=3, temperature=1.0, seed=[1, 2 ** 64, 3], max_tokens=3),
                   SamplingParams(temperature=1.0, seed=-1, max_tokens=3)):
        with pytest.raises(RequestError) as err:
            engine.add_request("bad-seed", p, params)
        assert err.value.field == "seed"
        assert not engine.has_unfinished_requests() and not engine.detokenizers
    # The last seeds that fit are served, and reported.
    (ok,) = engine.generate([p], SamplingParams(n=2, temperature=1.0, seed=top - 1, max_tokens=3,
                                                eos_token=[]))
    assert [c.seed for c in ok.ordered_choices] == [top - 1, top]
    assert all(len(c.token_ids) == 3 for c in ok.ordered_choices)
    assert_all_blocks_free(engine)


def test_a_choice_that_fails_to_build_leaves_nothing_behind(make_engine, vocab_size):
    """Issue 13 (defect 1): add is atomic. Validation no longer lets a bad seed
    through, so the failure is made past it: choice 1's generator refuses its seed."""
    engine = make_engine()
    (p,) = prompts(1, [5], vocab_size, seed=16)
    validated = engine.validate(p, SamplingParams(n=2, temperature=1.0, seed=[1, 2], max_tokens=3))
    unbuildable = dataclasses.replace(
        validated, params=SamplingParams(n=2, temperature=1.0, seed=[1, 2 ** 64], max_tokens=3))
    with pytest.raises(ValueError) as err:  # torch's own refusal
        engine.add_validated("orphan?", unbuildable)
    assert not isinstance(err.value, RequestError)
    assert not engine.groups and not engine.detokenizers and not engine.scheduler.has_work()
    engine.add_validated("fine", validated)
    while engine.has_unfinished_requests():
        engine.step()
    assert_all_blocks_free(engine)


def test_a_request_larger_than_the_kv_pool_is_refused(make_engine, vocab_size):
    """Issue 13 (defect 3): a prompt longer than the whole KV pool, with no
    `max_tokens`, passed validation (its default output went negative) and then
    waited forever, the engine loop spinning. Checked in blocks: a choice's K/V
    peaks at prompt + output - 1 tokens (the last token is never computed)."""
    engine = make_engine(block_size=4, kv_cache_memory=str(10 * 2048))
    capacity = engine.num_blocks * engine.block_size
    assert capacity == 40 and engine.max_model_len > capacity
    (p,) = prompts(1, [capacity + 5], vocab_size, seed=18)
    with pytest.raises(RequestError) as err:
        engine.add_request("prompt", p, SamplingParams(temperature=0.0, eos_token=[]))
    assert err.value.field == "prompt"
    with pytest.raises(RequestError) as err:
        engine.add_request("output", p[:10], SamplingParams(max_tokens=capacity - 8, **GREEDY))
    assert err.value.field == "max_tokens"
    with pytest.raises(RequestError) as err:
        engine.add_request("forced", p[:10], SamplingParams(forced_output_tokens=p[:capacity - 8], **GREEDY))
    assert err.value.field == "forced_output_tokens"
    assert not engine.has_unfinished_requests()
    # Exactly the pool, two choices that cannot both fit: served, one after the other.
    (ok,) = engine.generate([p[:10]], SamplingParams(n=2, max_tokens=capacity - 9, **GREEDY))
    assert [len(c.token_ids) for c in ok.ordered_choices] == [capacity - 9] * 2
    assert_all_blocks_free(engine)


def test_step_says_whether_it_scheduled_anything(make_engine, vocab_size):
    """Issue 13 (defect 3): an empty output list is no idle signal (a prefill chunk
    emits nothing); `last_step_scheduled` is, for a loop that must wait, not spin."""
    engine = make_engine(max_num_batched_tokens=8)
    (p,) = prompts(1, [20], vocab_size, seed=19)
    engine.add_request("chunked", p, SamplingParams(max_tokens=2, **GREEDY))
    assert engine.step() == [] and engine.last_step_scheduled  # the first chunk of three
    while engine.has_unfinished_requests():
        engine.step()
        assert engine.last_step_scheduled
    assert engine.step() == [] and not engine.last_step_scheduled


def test_the_stop_reason_names_the_stop_that_matched(make_engine, loaded, vocab_size):
    """Issue 13 (boundary): which stop ended a choice, so /v1/messages can fill
    `stop_sequence` without decoding tokens again: the string, or the token sequence."""
    engine = make_engine()
    (p,) = prompts(1, [6], vocab_size, seed=20)
    (free,) = engine.generate([p], SamplingParams(max_tokens=12, **GREEDY))
    ids = free.ordered_choices[0].token_ids
    assert free.ordered_choices[0].stop_reason is None  # length
    (by_tokens,) = engine.generate([p], SamplingParams(max_tokens=12, stop_tokens=[[ids[3], ids[4]]],
                                                       **GREEDY))
    choice = by_tokens.ordered_choices[0]
    assert choice.finish_reason == "stop" and choice.stop_reason == (ids[3], ids[4])
    assert choice.token_ids[-2:] == ids[3:5]
    text = loaded.tokenizer.decode(ids)
    stop = text[len(text) // 2:len(text) // 2 + 2]
    (by_string,) = engine.generate([p], SamplingParams(max_tokens=12, stop=["\x00never", stop], **GREEDY))
    assert by_string.ordered_choices[0].finish_reason == "stop"
    assert by_string.ordered_choices[0].stop_reason == stop


def test_min_tokens_with_a_stop_string_keeps_text_equal_to_tokens(make_engine, loaded, vocab_size):
    """Issue 13 (defect 4): a stop string seen before `min_tokens` cut the text while
    the engine kept generating, so `text` no longer matched `tokens`. Stops before
    min_tokens are not matched at all; for every choice the text is the tokens'
    text, cut just before the stop only when it finished on it."""
    engine = make_engine()
    tok = loaded.tokenizer

    def detokenize(prompt, tokens):  # as the detokenizer sees them: after the prompt's text
        return tok.decode(prompt + tokens)[len(tok.decode(prompt)):].rstrip("\ufffd")
    # A prompt whose greedy text shows a printable stop within 4 tokens, long before min_tokens.
    for seed in range(21, 80):
        (p,) = prompts(1, [6], vocab_size, seed=seed)
        (free,) = engine.generate([p], SamplingParams(max_tokens=24, **GREEDY))
        early = detokenize(p, free.ordered_choices[0].token_ids[:4])
        windows = [early[i:i + 2] for i in range(len(early) - 1)]
        stop = next((w for w in windows if w.isascii() and w.isprintable() and w.strip()), None)
        if stop:
            break
    else:
        pytest.skip("no greedy text with a printable stop early")
    min_tokens = 10
    params = [SamplingParams(max_tokens=24, min_tokens=min_tokens, stop=[stop], **GREEDY),
              SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=24, min_tokens=min_tokens,
                             stop=[stop], eos_token=[])]
    for out in engine.generate([p, p], params[0]) + engine.generate([p], params[1]):
        for c in out.ordered_choices:
            full = detokenize(p, c.token_ids)  # a trailing incomplete character is held back
            assert len(c.token_ids) > min_tokens
            if c.finish_reason == "stop":
                assert full.startswith(c.text + stop)
                # It ended on that stop: the stop ends in the last token's text, after min_tokens.
                assert len(c.text + stop) > len(detokenize(p, c.token_ids[:-1]))
                assert len(c.text + stop) > len(detokenize(p, c.token_ids[:min_tokens]))
            else:
                assert c.text == full and len(c.token_ids) == 24
    greedy = engine.generate([p], params[0])[0].ordered_choices[0]
    assert greedy.text.startswith(early)  # the early occurrence stays in the text
    assert_all_blocks_free(engine)


def test_a_grammar_on_a_model_without_eos_needs_an_eos_token(make_engine, loaded, vocab_size):
    """Found by the chaos run (tests/server/test_chaos.py): on a model with no EOS token
    the grammar library refused an empty stop set, a 500 for every constrained request.
    Such a request is a RequestError on `response_format` unless it gives `eos_token`,
    whose token then ends the output where the grammar may end."""
    from amity.engine.structured_output import StructuredOutputSpec

    engine = make_engine()
    assert not loaded.tokenizer.eos_token_ids
    (p,) = prompts(1, [5], vocab_size, seed=30)
    spec = StructuredOutputSpec("regex", "[0-9]{3}")
    with pytest.raises(RequestError) as err:
        engine.add_request("no-eos", p, SamplingParams(max_tokens=8, structured_output=spec))
    assert err.value.field == "response_format" and "eos_token" in err.value.message
    end = loaded.tokenizer.encode("<|endoftext|>", add_special_tokens=False)
    (out,) = engine.generate([p], SamplingParams(max_tokens=8, temperature=1.0, seed=4,
                                                 structured_output=spec, eos_token=end))
    choice = out.ordered_choices[0]
    assert choice.finish_reason == "stop" and choice.token_ids[-1] == end[0]
    assert len(choice.text) == 3 and choice.text.isdigit()
    assert_all_blocks_free(engine)


def test_a_prefix_cache_hit_moves_logprobs_by_rounding_only(make_engine, vocab_size):
    """Issue 13 (what the consistency test's warm-up hid): a prompt whose prefix comes
    from the cache computes only its remaining tokens, in a short chunk (the in-place
    kernel), where a miss computes the whole prompt in one long chunk (SDPA), so its K/V
    and logits round differently (about 1e-6 here; README "Numerics"). Greedy tokens
    agree and logprobs agree to that rounding; with the same cache state a request is
    reproduced bit for bit. A seeded sample can differ between a miss and a hit only
    where its draw lands within that rounding of a boundary between two tokens."""
    engine = make_engine(block_size=16)
    (p,) = prompts(1, [40], vocab_size, seed=31)
    params = SamplingParams(n=2, max_tokens=8, logprobs=1, temperature=1.0, seed=9, eos_token=[])
    miss, hit, hit_again = (engine.generate([p], params)[0] for _ in range(3))
    assert miss.num_cached_tokens == 0 and hit.num_cached_tokens == hit_again.num_cached_tokens == 32
    for a, b, c in zip(miss.ordered_choices, hit.ordered_choices, hit_again.ordered_choices):
        assert (b.token_ids, [lp.logprob for lp in b.logprobs]) == \
            (c.token_ids, [lp.logprob for lp in c.logprobs])  # bitwise
        assert a.token_ids == b.token_ids
        torch.testing.assert_close([lp.logprob for lp in a.logprobs],
                                   [lp.logprob for lp in b.logprobs], atol=1e-4, rtol=0)
    assert_all_blocks_free(engine)
