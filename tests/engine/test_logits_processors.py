"""Each sampling stage against its definition, and against transformers' own
processor where one exists. Every comparison runs a batch whose rows have
different settings and checks each row against that row processed alone."""

import random
from collections import Counter

import pytest
import torch
from transformers.generation.logits_process import (
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from amity.engine import logits_processors as lp
from amity.engine.sampler import Sampler, SamplingRow
from amity.engine.sampling_params import SamplingParams

V = 24
EOS = frozenset({V - 1})


def make_row(prompt, output, eos=EOS, **params) -> SamplingRow:
    return SamplingRow(SamplingParams(temperature=0.0, **params), list(prompt) + list(output), len(prompt),
                       None, eos)


def processed(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    return Sampler().processed_logits(logits, rows)


def hf(processor, history: list[int], row_logits: torch.Tensor) -> torch.Tensor:
    ids = torch.tensor([history], dtype=torch.long)
    return processor(ids, row_logits[None].clone())[0]


def assert_same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # -inf positions must agree exactly; finite values to float32 rounding.
    assert torch.equal(torch.isinf(actual), torch.isinf(expected))
    torch.testing.assert_close(actual, expected, rtol=1e-6, atol=1e-6)


def random_history(rng: random.Random, alphabet: int, max_len: int) -> tuple[list[int], list[int]]:
    # A small alphabet makes repeats (and so n-gram and phrase matches) common.
    prompt = [rng.randrange(alphabet) for _ in range(rng.randint(0, max_len))]
    output = [rng.randrange(alphabet) for _ in range(rng.randint(0, max_len))]
    return prompt, output


# --- 1. logit_bias ----------------------------------------------------------------


def test_logit_bias_is_added_per_row():
    torch.manual_seed(0)
    logits = torch.randn(3, V)
    biases = [{0: 5.0, 3: -2.5}, None, {3: 1.25, V - 1: -100.0}]
    out = processed(logits, [make_row([1], [], logit_bias=b) for b in biases])
    for i, b in enumerate(biases):
        expected = logits[i].clone()
        for tok, v in (b or {}).items():
            expected[tok] += v
        assert_same(out[i], expected)


# --- 2. bad_word_tokens -------------------------------------------------------------


def test_bad_words_match_hf_over_prompt_and_output():
    rng = random.Random(1)
    torch.manual_seed(1)
    rows, words = [], []
    for _ in range(12):
        prompt, output = random_history(rng, 4, 6)
        history = prompt + output
        bad = [[rng.randrange(V)] for _ in range(rng.randint(0, 2))]
        # Phrases built from the history's own suffix, so some do match,
        # including ones whose prefix straddles the prompt/output boundary.
        for k in (1, 2, 3):
            if len(history) >= k and rng.random() < 0.7:
                bad.append(history[-k:] + [rng.randrange(V - 1)])
        bad.append([rng.randrange(4) for _ in range(3)])
        rows.append(make_row(prompt, output, bad_word_tokens=bad))
        words.append(bad)
    logits = torch.randn(len(rows), V)
    out = processed(logits, rows)
    some_multi_token_ban = False
    for i, row in enumerate(rows):
        history = row.token_ids
        expected = hf(NoBadWordsLogitsProcessor(words[i]), history, logits[i]) if words[i] else logits[i]
        assert_same(out[i], expected)
        singles = {w[0] for w in words[i] if len(w) == 1}
        some_multi_token_ban |= bool(set(torch.isinf(out[i]).nonzero().flatten().tolist()) - singles)
    assert some_multi_token_ban  # the phrase rule was exercised, not only single words


def test_bad_word_equal_to_eos_is_banned_unlike_hf():
    # The spec bans bad words without exception; HF silently drops [eos].
    out = processed(torch.zeros(1, V), [make_row([1, 2], [], bad_word_tokens=[[V - 1]])])
    assert out[0, V - 1] == float("-inf")


# --- 3. no_repeat_ngram -------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 4])
def test_no_repeat_ngram_matches_hf(n):
    rng = random.Random(n)
    torch.manual_seed(n)
    rows = [make_row(*random_history(rng, 3, 12), no_repeat_ngram=n) for _ in range(16)]
    rows.append(make_row([0] * (n - 1), [], no_repeat_ngram=n))  # shorter than n: nothing banned
    logits = torch.randn(len(rows), V)
    out = processed(logits, rows)
    banned_any = False
    for i, row in enumerate(rows):
        history = row.token_ids
        assert_same(out[i], hf(NoRepeatNGramLogitsProcessor(n), history, logits[i]))
        banned_any |= bool(torch.isinf(out[i]).any())
    assert banned_any
    assert not torch.isinf(out[-1]).any()


# --- 4. min_tokens / min_total_tokens ----------------------------------------------------


def test_min_tokens_and_min_total_tokens_match_hf():
    torch.manual_seed(4)
    eos = frozenset({3, V - 1})
    cases = [  # (prompt length, output length, min_tokens, min_total_tokens)
        (5, 0, 2, None), (5, 1, 2, None), (5, 2, 2, None), (5, 9, 0, None),
        (5, 0, 0, 7), (5, 1, 0, 7), (5, 2, 0, 7), (5, 3, 0, 7),
    ]
    rows = [
        make_row([1] * np_, [2] * no, eos=eos, min_tokens=mt, min_total_tokens=mtt)
        for np_, no, mt, mtt in cases
    ]
    logits = torch.randn(len(rows), V)
    out = processed(logits, rows)
    for i, (np_, no, mt, mtt) in enumerate(cases):
        history = [1] * np_ + [2] * no
        if mtt is None:
            proc = MinNewTokensLengthLogitsProcessor(np_, mt, sorted(eos))
        else:
            proc = MinLengthLogitsProcessor(mtt, sorted(eos))
        assert_same(out[i], hf(proc, history, logits[i]))
    assert torch.isinf(out[0, 3]) and not torch.isinf(out[2, 3])  # the cases do cross the boundary


def test_min_tokens_also_suppresses_completing_stop_tokens():
    stops = [[7], [5, 8], [9, 9, 10]]
    rows = [
        make_row([9], [5], min_tokens=3, stop_tokens=stops),  # [5,8] completes; [9,9,10] not
        make_row([4, 9], [9], min_tokens=3, stop_tokens=stops),  # [9,9,10] across the boundary
        make_row([1], [5, 2, 5], min_tokens=3, stop_tokens=stops),  # reached: nothing
    ]
    out = processed(torch.zeros(3, V), rows)
    banned = [set(torch.isinf(r).nonzero().flatten().tolist()) for r in out]
    assert banned == [{7, 8, V - 1}, {7, 10, V - 1}, set()]


# --- 5. penalties -------------------------------------------------------------------


def test_repetition_penalty_matches_hf():
    rng = random.Random(5)
    torch.manual_seed(5)
    rows = [
        make_row(*random_history(rng, V, 10), repetition_penalty=rng.choice([1.0, 0.7, 1.3, 2.0]))
        for _ in range(10)
    ]
    logits = torch.randn(len(rows), V) * 3  # both signs matter: divide vs multiply
    out = processed(logits, rows)
    for i, row in enumerate(rows):
        history = row.token_ids
        if not history:
            assert_same(out[i], logits[i])
            continue
        proc = RepetitionPenaltyLogitsProcessor(row.params.repetition_penalty)
        assert_same(out[i], hf(proc, history, logits[i]))


def test_frequency_and_presence_penalties_count_output_only():
    rng = random.Random(6)
    torch.manual_seed(6)
    rows = []
    for _ in range(10):
        prompt, output = random_history(rng, 6, 10)
        rows.append(make_row(prompt, output, frequency_penalty=rng.uniform(-2, 2), presence_penalty=rng.uniform(-2, 2)))
    logits = torch.randn(len(rows), V)
    out = processed(logits, rows)
    for i, row in enumerate(rows):
        expected = logits[i].clone()
        for tok, c in Counter(row.token_ids[row.num_prompt_tokens:]).items():
            expected[tok] -= c * row.params.frequency_penalty + row.params.presence_penalty
        assert_same(out[i], expected)


def test_repetition_then_frequency_order():
    # logit 2 seen once in the output: rep 2 -> 1.0, then freq 0.5 -> 0.5.
    # The other order would give (2 - 0.5) / 2 = 0.75.
    logits = torch.zeros(1, V)
    logits[0, 4] = 2.0
    out = processed(logits, [make_row([], [4], repetition_penalty=2.0, frequency_penalty=0.5)])
    assert out[0, 4].item() == pytest.approx(0.5)


# --- 7-8. temperature, top_k, top_p, min_p, XTC -----------------------------------------------


def test_warpers_match_hf_row_by_row():
    rng = random.Random(7)
    torch.manual_seed(7)
    B = 16
    logits = torch.randn(B, V) * 2
    logits[3, :5] = float("-inf")  # already-banned tokens must stay out
    temps = [rng.choice([0.3, 0.7, 1.0, 1.8]) for _ in range(B)]
    ks = [rng.choice([0, 1, 3, 10, V, V + 5]) for _ in range(B)]
    ps = [rng.choice([1.0, 0.95, 0.7, 0.3, 0.05]) for _ in range(B)]
    mps = [rng.choice([0.0, 0.05, 0.3, 0.9]) for _ in range(B)]
    x = logits.clone()
    lp.apply_temperature(x, torch.tensor(temps))
    lp.apply_top_k(x, torch.tensor(ks))
    lp.apply_top_p(x, torch.tensor(ps))
    lp.apply_min_p(x, torch.tensor(mps))
    for i in range(B):
        procs = [TemperatureLogitsWarper(temps[i])]
        procs += [TopKLogitsWarper(ks[i])] if ks[i] > 0 else []
        procs += [TopPLogitsWarper(ps[i])] if ps[i] < 1 else []
        procs += [MinPLogitsWarper(mps[i])] if mps[i] > 0 else []
        expected = logits[i]
        for proc in procs:
            expected = hf(proc, [0], expected)
        assert_same(x[i], expected)


def test_top_p_keeps_smallest_set_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4)
    x = probs.log()
    lp.apply_top_p(x, torch.tensor([0.5, 0.8, 0.81, 0.01]))
    kept = [(~torch.isinf(r)).sum().item() for r in x]
    assert kept == [1, 2, 3, 1]


def test_xtc_removes_all_viable_but_the_least_likely():
    probs = torch.tensor([
        [0.4, 0.3, 0.2, 0.1],  # viable 0.4, 0.3 -> drop 0.4
        [0.4, 0.3, 0.2, 0.1],  # threshold 0.15: viable 0.4, 0.3, 0.2 -> keep only 0.2 of them
        [0.7, 0.1, 0.1, 0.1],  # one viable: no-op
        [0.4, 0.3, 0.2, 0.1],  # inactive this step
    ])
    x = probs.log()
    lp.apply_xtc(x, torch.tensor([0.25, 0.15, 0.25, 0.25]), torch.tensor([True, True, True, False]))
    removed = [torch.isinf(r).nonzero().flatten().tolist() for r in x]
    assert removed == [[0], [0, 1], [], []]


# --- candidate stages: the same warpers on each row's few most likely tokens ---------------


def reference_kept(logits, temps, ks, ps, mps) -> torch.Tensor:
    x = logits.clone()
    lp.apply_temperature(x, torch.tensor(temps))
    lp.apply_top_k(x, torch.tensor(ks))
    lp.apply_top_p(x, torch.tensor(ps))
    lp.apply_min_p(x, torch.tensor(mps))
    return x


@pytest.mark.parametrize("coarse", [False, True])
def test_candidate_truncation_matches_the_full_vocabulary_reference(coarse):
    # Coarse logits (as from bf16) tie often, also at the k-th and at the
    # candidates' edge; the narrow widths force the "not exact yet" reports.
    rng = random.Random(21 + coarse)
    torch.manual_seed(21 + coarse)
    B, vocab = 64, 200
    logits = torch.randn(B, vocab) * 2
    if coarse:
        logits = (logits * 2).round() / 2
    logits[5, :50] = float("-inf")
    temps = [rng.choice([0.3, 0.7, 1.0, 1.8]) for _ in range(B)]
    ks = [rng.choice([0, 1, 3, 10, 40]) for _ in range(B)]
    ps = [rng.choice([1.0, 0.95, 0.7, 0.3]) for _ in range(B)]
    mps = [rng.choice([0.0, 0.05, 0.3]) for _ in range(B)]
    for i in range(B):
        if ks[i] == 0 and ps[i] == 1.0 and mps[i] == 0.0:
            ps[i] = 0.5  # every row truncates
    expected = reference_kept(logits, temps, ks, ps, mps).softmax(dim=1)
    flagged = 0
    for width in (vocab, 12, 45, 120):
        w = torch.tensor([min(max(width, k + 1), vocab) for k in ks])
        cand = lp.top_candidates(logits, int(w.max()))
        temp = torch.tensor(temps)
        v, ids = lp.scale_candidates(*cand, temp)
        log_norm = (logits / temp[:, None]).logsumexp(dim=1)
        v, tied, short = lp.truncate_candidates(
            v.double(), vocab, torch.tensor(ks), torch.tensor(ps), torch.tensor(mps), log_norm)
        if width == vocab:
            assert not tied.any() and not short.any()
        got = torch.zeros(B, vocab, dtype=torch.float64).scatter_(1, ids, v.softmax(dim=1))
        for i in range(B):
            if tied[i] or short[i]:
                flagged += 1
                continue
            # Among equal logits the reference's sort picks which ones top_p keeps
            # arbitrarily (the candidates: lowest token id first), so with ties
            # the kept probabilities must agree as a multiset.
            a, b = got[i][got[i] > 0].float().sort().values, expected[i][expected[i] > 0].sort().values
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
            if not coarse:
                assert torch.equal(got[i] > 0, expected[i] > 0), (width, i)
    assert flagged  # the narrow widths did report rows to widen


def test_candidates_are_canonical_whatever_the_width():
    x = torch.tensor([[1.0, 3.0, 2.0, 3.0, 1.0, 3.0, 0.0, 2.0]])
    canonical = [1, 3, 5, 2, 7, 0, 4, 6]
    for width in (3, 4, 5, 6, 8):
        v, ids = lp.top_candidates(x, width)
        # Fixed wherever the logit is above the last candidate's (which may tie
        # with tokens left out: callers check exactly that).
        sure = (v[0] > v[0, -1]) | (width == 8)
        assert ids[0][sure].tolist() == canonical[: int(sure.sum())]
        assert set(ids[0].tolist()) <= set(canonical[:width + 2])
    # Temperature can merge distinct logits; the merged ones go by token id.
    v, ids = lp.scale_candidates(
        torch.tensor([[1.950000286102295, 1.9500001668930054]]), torch.tensor([[5, 2]]), torch.tensor([1.9]))
    assert v[0, 0] == v[0, 1] and ids[0].tolist() == [2, 5]


def test_xtc_candidates_match_apply_xtc():
    torch.manual_seed(23)
    B, vocab = 32, 40
    logits = torch.randn(B, vocab) * 2
    logits[::3, 2] = logits[::3, 3]  # ties among the viable ones
    threshold = torch.rand(B) * 0.2
    active = torch.rand(B) < 0.7
    ref = logits.clone()
    lp.apply_xtc(ref, threshold, active)
    v, ids = lp.top_candidates(logits, vocab)
    v = v.double()
    lp.xtc_candidates(v, threshold, active)
    got = torch.full((B, vocab), float("-inf"), dtype=torch.float64).scatter_(1, ids, v)
    assert torch.equal(torch.isinf(got), torch.isinf(ref))


def test_inverse_cdf_never_picks_a_removed_token():
    v = torch.tensor([[float("-inf"), 0.0, float("-inf"), -1.0, float("-inf")]] * 3, dtype=torch.float64)
    u = torch.tensor([0.0, 0.5, 1.0 - 2**-53], dtype=torch.float64)
    assert lp.inverse_cdf(v, u).tolist() == [1, 1, 3]
    # Float32 probabilities over a large vocabulary: the float64 cumsum still ends
    # on a kept token for u at the top of [0, 1).
    big = torch.full((2, 50_000), -3.0)
    big[:, -7:] = float("-inf")
    picked = lp.inverse_cdf(big, torch.tensor([1.0 - 2**-53, 0.0], dtype=torch.float64))
    assert picked.tolist() == [50_000 - 8, 0]
