"""The sampler's persistent token histories without a model: across a simulated run
with chunked prefill, preemption (recompute), prefix-cache hits and more requests
than input-batch rows, every sampling step's history-derived inputs (penalty pairs
and counts, bans) equal ones counted from scratch from the requests' own lists, and
the processed logits equal, bit for bit, those of rows that bring no history."""

import random
from collections import Counter

import pytest
import torch

import tests.engine.test_scheduler as scheduler_tests
from amity.engine.input_batch import InputBatch
from amity.engine.request import Request
from amity.engine.sampler import Sampler, SamplingRow, SamplingTensors
from amity.engine.sampling_params import SamplingParams
from amity.engine.scheduler import SchedulerOutput
from amity.engine.token_history import TokenHistory
from tests.engine.test_scheduler import BS, Sim

V = 8  # the ids 8 and 9 occur in histories too: outside the vocabulary, ignored
EOS = frozenset({V - 1})
sampler = Sampler()


def few_tokens(r: Request) -> int:
    """Deterministic in the request's state, from ten ids: outputs repeat."""
    return (sum(r.all_token_ids) * 31 + r.num_output_tokens) % 10


def penalised(rid: str, prompt: list[int], max_tokens: int, i: int) -> Request:
    # Every mix of the history-wide stages, and some rows with none of them.
    params = SamplingParams(
        temperature=0, max_tokens=max_tokens,
        repetition_penalty=[1.0, 1.3, 0.7][i % 3],
        frequency_penalty=[0.0, 0.5][i % 2],
        presence_penalty=[0.0, -0.25, 0.4][(i // 2) % 3],
        no_repeat_ngram=[1, 2, 3][(i // 3) % 3])
    return Request(request_id=rid, group_id=rid, choice_index=0, prompt_token_ids=prompt, params=params,
                   seed=0, eos_token_ids=EOS, max_output_tokens=max_tokens, min_output_tokens=0)


def counted_from_scratch(r: Request) -> tuple[list[int], list[tuple[int, int]], set[int]]:
    """What the sampler must read: the distinct in-vocabulary ids of prompt + output,
    those of the output with their counts, and the no_repeat_ngram bans."""
    history = r.all_token_ids
    output = history[r.num_prompt_tokens:]
    seen = sorted({t for t in history if 0 <= t < V})
    counts = sorted(Counter(t for t in output if 0 <= t < V).items())
    n = r.params.no_repeat_ngram
    bans = set()
    if n > 1:
        for i in range(len(history) - n + 1):
            if history[i:i + n - 1] == history[len(history) - n + 1:]:
                bans.add(history[i + n - 1])
    return seen, counts, {t for t in bans if t < V}


def per_row(pairs: tuple[torch.Tensor, ...] | None, num_rows: int) -> list[list[tuple]]:
    """Flat (row, token, values...) tensors -> each row's (token, values...) tuples."""
    out: list[list[tuple]] = [[] for _ in range(num_rows)]
    if pairs is not None:
        for row, *rest in zip(*(t.tolist() for t in pairs)):
            out[row].append(tuple(rest))
    return out


class HistorySim(Sim):
    def __init__(self, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.batch = InputBatch(self.sched.max_num_seqs, max_model_len=128, block_size=BS)
        self.rng = torch.Generator().manual_seed(seed)
        self.rows_checked = 0

    def check(self, plan: SchedulerOutput) -> None:
        super().check(plan)
        self.batch.sync([s.request for s in plan.scheduled])
        # The requests whose last row gives logits this step sample: the engine's rows.
        sampled = [s.request for s in plan.scheduled
                   if s.request.num_computed_tokens + s.num_new_tokens == s.request.num_tokens]
        if not sampled:
            return
        kept = [SamplingRow(r.params, r.all_token_ids, r.num_prompt_tokens, None, EOS, self.batch.history(r))
                for r in sampled]
        fresh = [SamplingRow(r.params, r.all_token_ids, r.num_prompt_tokens, None, EOS) for r in sampled]
        t = SamplingTensors.build(kept, V, torch.device("cpu"))
        repetition, frequency = per_row(t.repetition, len(sampled)), per_row(t.frequency, len(sampled))
        bans = per_row(t.bans, len(sampled))
        for i, r in enumerate(sampled):
            seen, counts, ngram_bans = counted_from_scratch(r)
            p = r.params
            if p.repetition_penalty != 1.0:
                assert repetition[i] == [(tok, pytest.approx(p.repetition_penalty)) for tok in seen]
            else:
                assert repetition[i] == []
            if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
                assert [(tok, n) for tok, n, _, _ in frequency[i]] == counts
            else:
                assert frequency[i] == []
            min_length = {V - 1} if r.num_output_tokens < p.min_tokens else set()
            assert {tok for (tok,) in bans[i]} == ngram_bans | min_length
        logits = torch.randn(len(sampled), V, generator=self.rng)
        assert torch.equal(sampler.processed_logits(logits, kept), sampler.processed_logits(logits, fresh))
        self.rows_checked += len(sampled)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_kept_histories_equal_a_count_from_scratch(monkeypatch, prefix_caching):
    monkeypatch.setattr(scheduler_tests, "fake_token", few_tokens)
    rng = random.Random(14)
    # 4 rows for 12 requests (rows are reused), blocks short enough to preempt,
    # a shared prefix for cache hits, prompts longer than one step's budget.
    sim = HistorySim(seed=14, num_blocks=12, max_num_seqs=4, max_num_batched_tokens=12,
                     prefix_caching=prefix_caching)
    shared = [3, 9, 3, 1, 3, 9, 2, 5]
    sim.add(*[penalised(f"r{i}", shared + [rng.randrange(10) for _ in range(3 + i % 5)], 6 + i % 5, i)
              for i in range(12)])
    sim.run()
    assert sim.preemptions, "the pool is meant to preempt"
    assert sim.rows_checked > 60
    assert all(r.is_finished for r in sim.requests)


def test_a_history_only_grows():
    history = TokenHistory(SamplingParams(repetition_penalty=1.2, no_repeat_ngram=2))
    history.extend([1, 2, 1, 2], num_prompt_tokens=2)
    assert history.seen.tolist() == [1, 2] and history.output_counts.tolist() == [1, 1]
    assert history.ngram_bans([1, 2, 1, 2]) == [1]
    with pytest.raises(ValueError):
        history.extend([1, 2, 1], num_prompt_tokens=2)


def test_a_row_that_changes_hands_starts_a_new_history():
    batch = InputBatch(1, max_model_len=16, block_size=BS)
    a, b = (penalised(rid, [1, 2, 3], 4, 1) for rid in "ab")
    batch.sync([a])
    batch.history(a).extend(a.all_token_ids, a.num_prompt_tokens)
    batch.sync([b])  # b takes a's only row
    assert batch.history(b).num_tokens == 0
