"""The whole sampler: batch invariance, the distribution it samples from,
seeded reproducibility, and the logprobs it reports."""

import math
import random
from collections import Counter

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

from amity.engine import logits_processors as lp
from amity.engine import sampler as sampler_module
from amity.engine.sampler import Sampler, SamplingRow
from amity.engine.sampling_params import SamplingParams

V = 32
EOS = frozenset({V - 1})
sampler = Sampler()


def make_row(prompt=(1, 2, 3), output=(), seed=0, **params) -> SamplingRow:
    p = SamplingParams(**params)
    gen = None if p.is_greedy else torch.Generator().manual_seed(seed)
    return SamplingRow(p, list(prompt) + list(output), len(prompt), gen, EOS)


def fresh(row: SamplingRow, seed: int) -> SamplingRow:
    """The same row with a new generator in the seed's initial state."""
    gen = None if row.params.is_greedy else torch.Generator().manual_seed(seed)
    return SamplingRow(row.params, list(row.token_ids), row.num_prompt_tokens, gen, row.eos_token_ids)


def random_rows(rng: random.Random, n: int) -> list[SamplingRow]:
    """Rows that each turn on a different mix of every stage."""
    rows = []
    for i in range(n):
        prompt = [rng.randrange(6) for _ in range(rng.randint(1, 8))]
        output = [rng.randrange(6) for _ in range(rng.randint(0, 8))]
        history = prompt + output
        rows.append(make_row(
            prompt, output, seed=100 + i,
            temperature=rng.choice([0.0, 0.5, 1.0, 1.5]),
            top_k=rng.choice([0, 3, 8]),
            top_p=rng.choice([1.0, 0.9, 0.5]),
            min_p=rng.choice([0.0, 0.1]),
            xtc_threshold=rng.choice([0.0, 0.1]),
            xtc_probability=rng.choice([0.0, 0.5]),
            repetition_penalty=rng.choice([1.0, 1.4, 0.8]),
            frequency_penalty=rng.choice([0.0, 0.7]),
            presence_penalty=rng.choice([0.0, -0.4]),
            logit_bias=rng.choice([None, {rng.randrange(V): 3.0}]),
            no_repeat_ngram=rng.choice([1, 2, 3]),
            bad_word_tokens=rng.choice([[], [[rng.randrange(V)], history[-1:] + [rng.randrange(V - 1)]]]),
            min_tokens=rng.choice([0, 4]),
            logprobs=rng.choice([None, 0, 3]),
        ))
    return rows


def hf_reference(logits_row: torch.Tensor, row: SamplingRow) -> torch.Tensor:
    """Stages 1-5 for one row, built from transformers' processors (plus the
    OpenAI penalties, which transformers lacks), in the documented order."""
    p, history = row.params, row.token_ids
    ids = torch.tensor([history])
    x = logits_row[None].clone()
    for tok, b in (p.logit_bias or {}).items():
        x[0, tok] += b
    if p.bad_word_tokens:
        x = NoBadWordsLogitsProcessor(p.bad_word_tokens)(ids, x)
    if p.no_repeat_ngram > 1:
        x = NoRepeatNGramLogitsProcessor(p.no_repeat_ngram)(ids, x)
    x = MinNewTokensLengthLogitsProcessor(row.num_prompt_tokens, p.min_tokens, sorted(EOS))(ids, x)
    if p.repetition_penalty != 1.0:
        x = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(ids, x)
    for tok, c in Counter(row.token_ids[row.num_prompt_tokens:]).items():
        x[0, tok] -= c * p.frequency_penalty + p.presence_penalty
    return x[0]


# --- batch invariance -----------------------------------------------------------------


def test_mixed_batch_rows_equal_rows_alone_and_hf():
    rng = random.Random(0)
    torch.manual_seed(0)
    rows = random_rows(rng, 24)
    logits = torch.randn(len(rows), V) * 2
    batch = sampler.processed_logits(logits, rows)
    out = sampler(logits, rows)
    for i, row in enumerate(rows):
        alone = sampler.processed_logits(logits[i : i + 1], [row])[0]
        assert torch.equal(batch[i], alone)
        expected = hf_reference(logits[i], row)
        assert torch.equal(torch.isinf(batch[i]), torch.isinf(expected))
        torch.testing.assert_close(batch[i], expected)
        solo = sampler(logits[i : i + 1], [fresh(row, 100 + i)])
        assert solo.token_ids[0] == out.token_ids[i]
        assert solo.logprobs[0] == out.logprobs[i]


def test_greedy_row_takes_argmax_of_penalized_logits_ignoring_truncation():
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0] + [-5.0] * (V - 4)])
    row = make_row([1], [1], temperature=0.0, repetition_penalty=2.0, top_k=1, top_p=0.1)
    assert sampler(logits, [row]).token_ids == [2]  # 3.0 / 2 = 1.5 < 2.0


def test_editable_logits_sample_as_a_copy_does():
    """`editable=True` (the engine's rows, its own) spares stages 1-5 their copy: the
    same tokens and logprobs, every stage on."""
    rows = random_rows(random.Random(2), 16)
    logits = torch.randn(len(rows), V) * 3
    copied = sampler(logits, rows)
    with torch.inference_mode():  # as the engine's logits come
        edited = logits.clone()
    in_place = sampler(edited, [fresh(row, 100 + i) for i, row in enumerate(rows)], editable=True)
    assert in_place.token_ids == copied.token_ids and in_place.logprobs == copied.logprobs
    assert not torch.equal(edited, logits)  # the stages did write to the rows handed over


@pytest.mark.parametrize("stages", ["none", "plain sampling", "xtc", "truncation", "all"])
def test_the_sampler_never_writes_to_its_logits(stages):
    """Where no stage edits the logits the sampler reads them without a copy, so no
    later stage may write to them."""
    torch.manual_seed(0)
    params = {"none": dict(temperature=0.0, logprobs=3), "plain sampling": dict(temperature=0.7),
              "xtc": dict(temperature=1.0, xtc_threshold=0.01, xtc_probability=1.0),
              "truncation": dict(temperature=1.0, top_k=3, top_p=0.5, min_p=0.1, logprobs=2)}
    rows = random_rows(random.Random(1), 8) if stages == "all" else [make_row(seed=i, **params[stages])
                                                                      for i in range(8)]
    logits = torch.randn(8, V) * 3
    before = logits.clone()
    sampler(logits, rows)
    sampler.score(logits, rows, list(range(8)))
    assert torch.equal(logits, before)


@pytest.mark.parametrize("vocab", [1, 15, 16, 17, 49152, 49157])
def test_greedy_kernel_gives_torch_argmax(vocab):
    """csrc/argmax.cpp: the first index of the largest value, the first NaN of a row
    with NaNs, index 0 of a row of -inf; -0.0 ties with 0.0; views as well as rows."""
    torch.manual_seed(vocab)
    x = torch.randn(24, vocab)
    x[1] = -math.inf
    x[2, vocab // 2] = math.nan
    x[3] = 7.0
    x[4] = (x[4] * 2).round()
    if vocab > 3:
        x[5, 1] = x[5, 3] = 100.0
        x[6] = -1.0
        x[6, 0], x[6, vocab - 1] = -0.0, 0.0
        x[7, 0], x[7, vocab - 1] = math.inf, math.nan
    for view in (x, x[::2], x[:, : max(1, vocab - 2)]):
        assert torch.equal(sampler_module._argmax(view), view.argmax(dim=1))


@pytest.mark.parametrize("temperature", [1e-45, 1e-30, 1e-7])
def test_a_tiny_positive_temperature_is_greedy(temperature):
    """Issue 13 (defect 9): logits divided by 1e-45 overflow to inf and the draw
    picks garbage; below the sampling epsilon a temperature is greedy, as in vLLM."""
    torch.manual_seed(3)
    logits = torch.randn(16, V) * 4
    rows = [make_row(seed=i, temperature=temperature, top_k=[0, 5][i % 2], top_p=[1.0, 0.8][i // 8])
            for i in range(16)]
    assert sampler(logits, rows).token_ids == logits.argmax(dim=1).tolist()


def test_random_row_without_generator_is_refused():
    row = SamplingRow(SamplingParams(), [1], 1, None, EOS)
    with pytest.raises(ValueError, match="no generator"):
        sampler(torch.zeros(1, V), [row])


# --- the sampled distribution -------------------------------------------------------------

BASE = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0])
N_DRAWS = 20_000


def expected_distribution(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> list[float]:
    """Straight from the definitions, in plain Python floats."""
    z = [math.exp(v / temperature) for v in BASE.tolist()]
    p = [v / sum(z) for v in z]
    order = sorted(range(len(p)), key=lambda i: -p[i])
    keep = set(order[:top_k] if top_k else order)
    mass, kept_p = 0.0, set()
    for i in order:  # smallest most-likely-first set reaching top_p, within top_k
        if i in keep and mass < top_p:
            kept_p.add(i)
            mass += p[i]
    q = [p[i] if i in kept_p else 0.0 for i in range(len(p))]
    floor = min_p * max(q)
    q = [v if v >= floor else 0.0 for v in q]
    return [v / sum(q) for v in q]


def draw_many(n: int = N_DRAWS, seed0: int = 0, **params) -> list[float]:
    """Empirical frequencies from n rows in one batch, each with its own seed."""
    logits = BASE.expand(n, -1)
    rows = [make_row(seed=seed0 + s, **params) for s in range(n)]
    counts = Counter(sampler(logits, rows).token_ids)
    return [counts[i] / n for i in range(len(BASE))]


def assert_matches(freq: list[float], expected: list[float]) -> None:
    # Per token within 4 sigma of a binomial; removed tokens never drawn.
    for f, p in zip(freq, expected):
        if p == 0.0:
            assert f == 0.0
        else:
            assert abs(f - p) <= 4 * math.sqrt(p * (1 - p) / N_DRAWS) + 1e-9, (freq, expected)
    assert 0.5 * sum(abs(f - p) for f, p in zip(freq, expected)) < 0.02


@pytest.mark.parametrize(
    "params",
    [
        dict(),
        dict(temperature=0.6),
        dict(temperature=1.7, top_k=5),
        dict(top_p=0.8),
        dict(temperature=1.3, top_k=6, top_p=0.9, min_p=0.15),
        dict(min_p=0.3),
    ],
)
@pytest.mark.parametrize("probe", [128, 2])
def test_sampled_frequencies_match_the_truncated_distribution(params, probe, monkeypatch):
    # probe 2: top_p / min_p rows start from 2 candidates and must widen.
    monkeypatch.setattr(sampler_module, "PROBE_WIDTH", probe)
    assert_matches(draw_many(**params), expected_distribution(**params))


def test_xtc_frequencies():
    # top_k=3 leaves renormalized probs p0 > p1 > p2; with threshold between
    # p1 and p2 (and below p0) XTC, when it fires, drops token 0 only.
    p = expected_distribution(top_k=3)
    threshold = (p[1] + p[2]) / 2
    fired = [0.0, p[1] / (p[1] + p[2]), p[2] / (p[1] + p[2])] + [0.0] * (len(p) - 3)
    chance = 0.4
    mix = [chance * f + (1 - chance) * q for f, q in zip(fired, p)]
    assert_matches(draw_many(top_k=3, xtc_threshold=threshold, xtc_probability=chance), mix)
    # A threshold only the top token reaches leaves nothing to exclude.
    assert_matches(draw_many(top_k=3, xtc_threshold=p[0] - 0.01, xtc_probability=1.0), p)


def test_large_vocab_rows_with_ties_equal_rows_alone(monkeypatch):
    # A vocabulary wider than the candidates, coarse (tied) logits and a tiny
    # probe: every widening path runs, and each row still samples from exactly
    # the reference's kept set, the same token as when alone.
    monkeypatch.setattr(sampler_module, "PROBE_WIDTH", 3)
    monkeypatch.setattr(sampler_module, "WIDEN", 4)
    rng = random.Random(31)
    torch.manual_seed(31)
    vocab, n = 400, 48
    logits = (torch.randn(n, vocab) * 4).round() / 2
    rows = []
    for i in range(n):
        rows.append(make_row(
            [1, 2], [3], seed=200 + i,
            temperature=rng.choice([0.0, 0.7, 1.0, 1.9]),
            top_k=rng.choice([0, 0, 1, 5, 30]),
            top_p=rng.choice([1.0, 0.99, 0.9, 0.5]),
            min_p=rng.choice([0.0, 0.0, 0.01, 0.2]),
            xtc_threshold=rng.choice([0.0, 0.05]),
            xtc_probability=rng.choice([0.0, 1.0]),
            logprobs=rng.choice([None, 0, 4]),
        ))
    out = sampler(logits, rows)
    for i, row in enumerate(rows):
        solo = sampler(logits[i : i + 1], [fresh(row, 200 + i)])
        assert solo.token_ids[0] == out.token_ids[i]
        assert solo.logprobs[0] == out.logprobs[i]
        p = row.params
        if p.is_greedy:
            continue
        x = logits[i : i + 1] / p.temperature
        for apply, value in ((lp.apply_top_k, p.top_k), (lp.apply_top_p, p.top_p), (lp.apply_min_p, p.min_p)):
            apply(x, torch.tensor([value]))
        # XTC only ever removes tokens from this set; among equal logits the
        # reference's sort keeps an arbitrary few, so compare by logit.
        assert logits[i, out.token_ids[i]] >= logits[i][~torch.isinf(x[0])].min(), i


def test_top_logprobs_break_ties_by_token_id():
    logits = torch.zeros(2, V)
    logits[:, [9, 4, 20, 13]] = 1.0
    rows = [make_row(logprobs=3, temperature=0.0), make_row(logprobs=3, top_k=2)]
    out = sampler(logits, rows)
    assert [[t for t, _ in o.top] for o in out.logprobs] == [[4, 9, 13], [4, 9, 13]]
    assert sampler.score(logits, rows, out.token_ids) == out.logprobs
    assert out.token_ids[0] == 4 and out.token_ids[1] in (4, 9, 13, 20)


# --- seeded reproducibility ------------------------------------------------------------


def generate(rows: list[SamplingRow], watch: int, steps: int, logits_seed: int = 9) -> list[int]:
    """Run `steps` sampler steps and return the tokens of row `watch`. The
    logits depend only on the step, so every row sees the same ones."""
    g = torch.Generator().manual_seed(logits_seed)
    step_logits = [torch.randn(V, generator=g) for _ in range(steps)]
    got = []
    for s in range(steps):
        out = sampler(torch.stack([step_logits[s]] * len(rows)), rows)
        for row, tok in zip(rows, out.token_ids):
            row.token_ids.append(tok)
        got.append(out.token_ids[watch])
    return got


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=1.2, top_p=0.95, xtc_threshold=0.05, xtc_probability=0.5, repetition_penalty=1.1),
        # No XTC here while a neighbour has it: its extra draw must not leak.
        dict(temperature=0.8, top_k=10),
    ],
)
def test_same_seed_same_tokens_whatever_the_batch(params):
    rng = random.Random(3)
    alone = generate([make_row(seed=42, **params)], 0, 12)
    others = [make_row(seed=5, xtc_threshold=0.05, xtc_probability=1.0)] + random_rows(rng, 5)
    first = generate([make_row(seed=42, **params)] + others[:3], 0, 12)
    middle = generate([fresh(r, 7 + i) for i, r in enumerate(others)][:4] + [make_row(seed=42, **params)], 4, 12)
    assert alone == first == middle
    assert generate([make_row(seed=43, **params)], 0, 12) != alone


# --- logprobs -------------------------------------------------------------------------


def test_logprobs_are_of_the_penalized_distribution_before_temperature():
    torch.manual_seed(11)
    logits = torch.randn(3, V)
    rows = [
        make_row([1, 2], [5, 5], temperature=0.3, top_k=2, repetition_penalty=1.5, frequency_penalty=0.4, logprobs=5),
        make_row([4], [], temperature=0.0, logit_bias={7: 2.0}, logprobs=0),
        make_row([4], [], temperature=1.0, logprobs=None),
    ]
    out = sampler(logits, rows)
    ref = torch.stack([hf_reference(logits[i], r) for i, r in enumerate(rows)]).log_softmax(dim=1)
    for i, n in enumerate([5, 0]):
        tok = out.token_ids[i]
        got = out.logprobs[i]
        assert got.token_id == tok
        assert got.logprob == pytest.approx(ref[i, tok].item(), abs=1e-5)
        top = ref[i].topk(n) if n else None
        assert [t for t, _ in got.top] == ([] if top is None else top.indices.tolist())
        assert [v for _, v in got.top] == pytest.approx([] if top is None else top.values.tolist(), abs=1e-5)
    assert out.logprobs[2] is None


def test_score_equals_what_sampling_reports():
    rng = random.Random(12)
    torch.manual_seed(12)
    rows = [r for r in random_rows(rng, 16) if r.params.logprobs is not None]
    logits = torch.randn(len(rows), V)
    out = sampler(logits, rows)
    scored = sampler.score(logits, rows, out.token_ids)
    assert scored == out.logprobs


def test_score_of_forced_tokens():
    logits = torch.tensor([[1.0, 2.0, 3.0] + [0.0] * (V - 3)] * 2)
    rows = [
        make_row([0], [], temperature=0.0, bad_word_tokens=[[2]], logprobs=None),
        make_row([0], [], logprobs=2),
    ]
    scored = sampler.score(logits, rows, [2, 0])
    assert scored[0].logprob == float("-inf") and scored[0].top == []
    ref = logits[1].log_softmax(0)
    assert scored[1].logprob == pytest.approx(ref[0].item())
    assert [t for t, _ in scored[1].top] == [2, 1]


def test_half_precision_logits_are_processed_in_float32():
    logits = torch.randn(2, V).to(torch.bfloat16)
    rows = [make_row(logprobs=1), make_row(temperature=0.0, logprobs=1)]
    out = sampler(logits, rows)
    assert out.logprobs[1].logprob == pytest.approx(logits[1].float().log_softmax(0).max().item(), abs=1e-6)
