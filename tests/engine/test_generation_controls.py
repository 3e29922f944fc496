"""The Friendli generation controls end to end through the engine, on a tiny model.

Each request in a mixed batch (greedy, seeded sampling, penalties, bad words,
different stops) must get exactly the output it gets alone; inputs that change K/V
(replaced embeddings) must never hit or feed the prefix cache.
"""

import pytest
import torch

from amity.config import EngineConfig
from amity.engine.errors import RequestError
from amity.engine.llm_engine import LLMEngine
from amity.engine.outputs import FinalOutput
from amity.engine.sampling_params import SamplingParams
from amity.models.loader import load_model


@pytest.fixture(scope="module")
def loaded(tiny_llama_path):
    return load_model(tiny_llama_path, torch.float32, torch.device("cpu"))


@pytest.fixture
def engine(tiny_llama_path, loaded):
    return LLMEngine(EngineConfig(model=str(tiny_llama_path), dtype="float32", kv_cache_memory="16MiB",
                                  block_size=4, max_num_seqs=16, max_num_batched_tokens=64),
                     loaded=loaded)


PROMPT = [5, 17, 42, 99, 7, 23, 61, 12, 8, 200, 31]


def run_batch(engine: LLMEngine, requests: dict[str, tuple[list[int], SamplingParams]], **kw):
    finals = {}
    for rid, (ids, params) in requests.items():
        engine.add_request(rid, ids, params, **kw.get(rid, {}))
        finals[rid] = FinalOutput(rid)
    while engine.has_unfinished_requests():
        for out in engine.step():
            finals[out.request_id].add(out)
    return finals


def mixed_requests(vocab: int) -> dict[str, tuple[list[int], SamplingParams]]:
    return {
        "greedy": (PROMPT, SamplingParams(temperature=0, max_tokens=12, eos_token=[])),
        "seeded": (PROMPT[:7], SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=12,
                                              eos_token=[])),
        "penalties": (PROMPT[2:], SamplingParams(temperature=0.7, seed=5, repetition_penalty=1.3,
                                                 frequency_penalty=0.5, presence_penalty=0.4,
                                                 max_tokens=12, eos_token=[])),
        "bad_words": (PROMPT[:5], SamplingParams(temperature=0, bad_word_tokens=[[3], [44, 45]],
                                                 no_repeat_ngram=2, max_tokens=12, eos_token=[])),
        "stops": (PROMPT[4:], SamplingParams(temperature=1.0, seed=3, top_k=20, min_p=0.05,
                                             stop_tokens=[[vocab - 1]], max_tokens=12, eos_token=[],
                                             logprobs=3)),
    }


def test_mixed_batch_gives_each_request_its_solo_output(engine, loaded):
    vocab = loaded.config.vocab_size
    together = run_batch(engine, mixed_requests(vocab))
    for rid, request in mixed_requests(vocab).items():
        alone = run_batch(engine, {rid + "-alone": request})[rid + "-alone"]
        a, b = together[rid].ordered_choices[0], alone.ordered_choices[0]
        assert a.token_ids == b.token_ids, rid
        assert a.text == b.text
        if request[1].logprobs is not None:
            assert [lp.token_id for lp in a.logprobs] == a.token_ids
            assert [round(lp.logprob, 4) for lp in a.logprobs] == [round(lp.logprob, 4) for lp in b.logprobs]
    banned = together["bad_words"].ordered_choices[0].token_ids
    assert 3 not in banned
    assert all(banned[i:i + 2] != [44, 45] for i in range(len(banned) - 1))


def test_seed_list_reproduces_each_choice_and_drawn_seeds_are_returned(engine):
    [out] = run_batch(engine, {"n3": (PROMPT, SamplingParams(n=3, temperature=1.0, seed=[7, 8, 9],
                                                             max_tokens=10, eos_token=[]))}).values()
    choices = out.ordered_choices
    assert [c.seed for c in choices] == [7, 8, 9]
    assert len({tuple(c.token_ids) for c in choices}) == 3  # different seeds differ
    for choice in choices:
        [solo] = run_batch(engine, {f"s{choice.seed}": (PROMPT, SamplingParams(
            temperature=1.0, seed=choice.seed, max_tokens=10, eos_token=[]))}).values()
        assert solo.ordered_choices[0].token_ids == choice.token_ids
    # No seed: one is drawn per choice and reported, and passing it back reproduces.
    [drawn] = run_batch(engine, {"d": (PROMPT, SamplingParams(temperature=1.0, max_tokens=10,
                                                              eos_token=[]))}).values()
    seed = drawn.ordered_choices[0].seed
    [again] = run_batch(engine, {"d2": (PROMPT, SamplingParams(temperature=1.0, seed=seed, max_tokens=10,
                                                               eos_token=[]))}).values()
    assert again.ordered_choices[0].token_ids == drawn.ordered_choices[0].token_ids


def test_min_tokens_suppresses_eos_and_eos_token_replaces_the_eos_set(engine):
    greedy = SamplingParams(temperature=0, max_tokens=8, eos_token=[])
    [free] = run_batch(engine, {"free": (PROMPT, greedy)}).values()
    tokens = free.ordered_choices[0].token_ids
    # Declare the 3rd greedy token an EOS: generation stops right there...
    stop_at = tokens[2]
    first = tokens.index(stop_at)
    [stopped] = run_batch(engine, {"eos": (PROMPT, SamplingParams(temperature=0, max_tokens=8,
                                                                  eos_token=[stop_at]))}).values()
    assert stopped.ordered_choices[0].token_ids == tokens[:first + 1]
    assert stopped.ordered_choices[0].finish_reason == "stop"
    # ...unless min_tokens asks for more: the EOS is then never sampled before it.
    [held] = run_batch(engine, {"min": (PROMPT, SamplingParams(temperature=0, max_tokens=8, min_tokens=6,
                                                               eos_token=[stop_at]))}).values()
    held_tokens = held.ordered_choices[0].token_ids
    assert len(held_tokens) >= 6
    assert stop_at not in held_tokens[:5]


def test_stop_token_sequences_and_total_token_limits(engine):
    [free] = run_batch(engine, {"free": (PROMPT, SamplingParams(temperature=0, max_tokens=10,
                                                                eos_token=[]))}).values()
    tokens = free.ordered_choices[0].token_ids
    seq = tokens[3:5]
    [stopped] = run_batch(engine, {"st": (PROMPT, SamplingParams(temperature=0, max_tokens=10, eos_token=[],
                                                                 stop_tokens=[seq]))}).values()
    out = stopped.ordered_choices[0]
    assert out.finish_reason == "stop"
    assert out.token_ids[-2:] == seq and out.token_ids == tokens[:len(out.token_ids)]
    [total] = run_batch(engine, {"mt": (PROMPT, SamplingParams(
        temperature=0, max_total_tokens=len(PROMPT) + 4, eos_token=[]))}).values()
    assert total.ordered_choices[0].token_ids == tokens[:4]
    assert total.ordered_choices[0].finish_reason == "length"


def test_replaced_embedding_equal_to_the_tokens_own_changes_nothing(engine, loaded):
    model = loaded.model
    index, token = 6, 77
    prompt = PROMPT[:index] + [token] + PROMPT[index + 1:]
    own = model.embed(torch.tensor([token]))[0].float().tolist()
    params = SamplingParams(temperature=0, max_tokens=8, eos_token=[])
    finals = run_batch(engine, {"plain": (prompt, params), "replaced": (PROMPT, params)},
                       replaced={"embedding_to_replace": own, "token_index_to_replace": [index]})
    assert finals["replaced"].ordered_choices[0].token_ids == finals["plain"].ordered_choices[0].token_ids


def test_replaced_embeddings_change_output_and_never_touch_the_prefix_cache(
        tiny_llama_path, loaded, engine):
    hidden = loaded.config.hidden_size
    prompt = PROMPT + [9, 10, 11, 13, 14]  # 16 tokens: 4 full blocks of 4
    params = SamplingParams(temperature=0, max_tokens=8, eos_token=[])
    vector = [3.0 if i % 2 else -3.0 for i in range(hidden)]
    replace = {"embedding_to_replace": vector, "token_index_to_replace": [5]}  # in block 1
    reference = LLMEngine(EngineConfig(model=str(tiny_llama_path), dtype="float32",
                                       kv_cache_memory="16MiB", block_size=4,
                                       enable_prefix_caching=False), loaded=loaded)
    [plain_ref] = run_batch(reference, {"p": (prompt, params)}).values()
    [replaced_ref] = run_batch(reference, {"r": (prompt, params)}, r=replace).values()
    assert replaced_ref.ordered_choices[0].token_ids != plain_ref.ordered_choices[0].token_ids

    # Replaced first, on a fresh cache: it must publish nothing past block 0, so the
    # plain request after it hits block 0 only and computes the right output.
    [first] = run_batch(engine, {"r1": (prompt, params)}, r1=replace).values()
    [plain] = run_batch(engine, {"p1": (prompt, params)}).values()
    assert plain.num_cached_tokens == 4
    assert plain.ordered_choices[0].token_ids == plain_ref.ordered_choices[0].token_ids
    # Now the plain prompt's blocks are cached; a replaced request may hit block 0 only.
    [second] = run_batch(engine, {"r2": (prompt, params)}, r2=replace).values()
    assert second.num_cached_tokens == 4
    for out in (first, second):
        assert out.ordered_choices[0].token_ids == replaced_ref.ordered_choices[0].token_ids


@pytest.mark.parametrize("params, kwargs, field", [
    (dict(encoder_no_repeat_ngram=3), {}, "encoder_no_repeat_ngram"),
    (dict(encoder_repetition_penalty=1.2), {}, "encoder_repetition_penalty"),
    ({}, {"embedding_to_replace": [0.0] * 5, "token_index_to_replace": [0]}, "embedding_to_replace"),
    ({}, {"embedding_to_replace": [], "token_index_to_replace": [0]}, "token_index_to_replace"),
    ({}, {"embedding_to_replace": [0.0] * 64, "token_index_to_replace": [len(PROMPT)]},
     "token_index_to_replace"),
    (dict(forced_output_tokens=[10**6]), {}, "forced_output_tokens"),
    (dict(bad_word_tokens=[[10**6]]), {}, "bad_word_tokens"),
])
def test_inapplicable_controls_are_refused_clearly(engine, params, kwargs, field):
    with pytest.raises(RequestError) as error:
        engine.add_request("bad", PROMPT, SamplingParams(max_tokens=4, **params), **kwargs)
    assert error.value.field == field
    assert not engine.has_unfinished_requests()
