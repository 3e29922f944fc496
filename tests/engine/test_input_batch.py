"""The persistent input batch without a model: across a simulated run with chunked
prefill, preemption, prefix-cache hits and more requests than rows, every step's
gathered tensors equal the ones built afresh from the requests' own lists."""

import pytest
import torch

from amity.engine.input_batch import InputBatch
from amity.engine.model_runner import ModelRunner
from amity.engine.scheduler import SchedulerOutput
from amity.models.prompt_rows import PromptRows
from tests.engine.test_scheduler import BS, Sim, req


def fresh(plan: SchedulerOutput) -> dict[str, list]:
    """The step's tensors as plain lists, from the requests' state alone."""
    ids, positions, slots, tables, query_start, context_lens, logit_flat, prompt_rows = [], [], [], [], [0], [], [], []
    for s in plan.scheduled:
        r, start, n = s.request, s.start_position, s.num_new_tokens
        flat_start = len(ids)
        ids += r.all_token_ids[start:start + n]
        positions += range(start, start + n)
        slots += [r.block_table[p // BS] * BS + p % BS for p in range(start, start + n)]
        tables.append(list(r.block_table))
        query_start.append(flat_start + n)
        context_lens.append(start + n)
        logit_flat += [flat_start + p - start for p in range(max(start, r.first_logit_position), start + n)]
        prompt_rows += [p < r.num_prompt_tokens for p in range(start, start + n)]
    width = max(len(t) for t in tables)
    return {"input_ids": ids, "positions": positions, "slot_mapping": slots,
            "block_tables": [t + [0] * (width - len(t)) for t in tables],
            "query_start": query_start, "context_lens": context_lens, "logits_indices": logit_flat,
            "prompt_rows": prompt_rows}


class CheckedSim(Sim):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        batch = InputBatch(self.sched.max_num_seqs, max_model_len=128, block_size=BS)
        self.runner = ModelRunner(None, torch.empty(0), BS, torch.device("cpu"), torch.float32, batch,
                                  prompt_rows=PromptRows())
        self.steps_checked = 0

    def check(self, plan: SchedulerOutput) -> None:
        super().check(plan)
        if not plan.scheduled:
            return
        got = self.runner.prepare(plan)
        gathered = {"input_ids": got.input_ids, "positions": got.positions,
                    "slot_mapping": got.attn.slot_mapping, "block_tables": got.attn.block_tables,
                    "query_start": got.attn.query_start, "context_lens": got.attn.context_lens,
                    "logits_indices": got.logits_indices, "prompt_rows": got.prompt_rows}
        for name, want in fresh(plan).items():
            assert gathered[name].dtype == (torch.bool if name == "prompt_rows" else torch.long), name
            assert gathered[name].tolist() == want, name
        self.steps_checked += 1


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_gathered_step_equals_the_fresh_build(prefix_caching):
    # 4 rows for 10 requests (rows are reused), blocks short enough to preempt,
    # a shared prefix for cache hits, prompts longer than one step's budget.
    sim = CheckedSim(num_blocks=10, max_num_seqs=4, max_num_batched_tokens=12, prefix_caching=prefix_caching)
    shared = list(range(100, 108))
    sim.add(*[req(f"r{i}", shared + list(range(i * 10, i * 10 + 3 + i % 5)), max_tokens=6 + i % 4)
              for i in range(10)])
    sim.run()
    assert sim.preemptions, "the pool is meant to preempt"
    assert sim.steps_checked > 20
    assert all(r.is_finished for r in sim.requests)


def test_a_row_follows_a_freed_and_refilled_block_table():
    batch = InputBatch(2, max_model_len=16, block_size=BS)
    r = req("r", range(6))
    r.block_table = [5, 6]
    (row,) = batch.sync([r])
    assert batch.block_tables[row, :2].tolist() == [5, 6]
    r.block_table = []  # freed (a new list), then refilled with other blocks
    r.block_table.extend([9, 3])
    batch.sync([r])
    assert batch.block_tables[row, :2].tolist() == [9, 3]
    r.append_output(42)
    batch.sync([r])
    assert batch.token_ids[row, :7].tolist() == [0, 1, 2, 3, 4, 5, 42]


def test_more_requests_in_a_step_than_rows_is_refused():
    batch = InputBatch(1, max_model_len=16, block_size=BS)
    with pytest.raises(RuntimeError):
        batch.sync([req("a", [1]), req("b", [2])])
