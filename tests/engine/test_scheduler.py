"""The scheduler without a model: steps are simulated.

A simulated step is what the engine does around the model: `schedule()`, then
`update_after_step()`, then one fake output token for every scheduled request
that has caught up (`num_computed_tokens == num_tokens`, i.e. its last row
produced logits), then `finish()` for those that reached `max_tokens`. Every step
also checks the invariants that must always hold: the token budget, the sequence
cap, block tables covering what was scheduled, and ref counts.
"""

import pytest

from amity.engine.kv_cache_manager import KVCacheManager
from amity.engine.request import Request, RequestStatus
from amity.engine.sampling_params import SamplingParams
from amity.engine.scheduler import Scheduler, SchedulerOutput

BS = 4  # block size


def req(rid: str, prompt, max_tokens: int = 4, prefix_source: Request | None = None) -> Request:
    return Request(request_id=rid, group_id=rid, choice_index=0, prompt_token_ids=list(prompt),
                   params=SamplingParams(temperature=0, max_tokens=max_tokens), seed=0,
                   eos_token_ids=frozenset(), max_output_tokens=max_tokens, min_output_tokens=0,
                   prefix_source=prefix_source)


def fake_token(r: Request) -> int:
    """Deterministic in the request's state, like greedy decoding."""
    return 1000 + (sum(r.all_token_ids) * 31 + r.num_output_tokens) % 997


class Sim:
    def __init__(self, num_blocks=64, max_num_seqs=8, max_num_batched_tokens=32, prefix_caching=True):
        self.kv = KVCacheManager(num_blocks, BS, prefix_caching)
        self.sched = Scheduler(self.kv, max_num_seqs, max_num_batched_tokens)
        self.requests: list[Request] = []
        self.plans: list[SchedulerOutput] = []
        # Per step, (request, start position, num new tokens) as scheduled.
        self.log: list[list[tuple[Request, int, int]]] = []
        # Per step with preemptions: (victims in order, running list before the step).
        self.preemptions: list[tuple[list[Request], list[Request]]] = []

    def add(self, *requests: Request) -> None:
        for r in requests:
            self.requests.append(r)
            self.sched.add(r)

    def step(self) -> SchedulerOutput:
        running_before = list(self.sched.running)
        plan = self.sched.schedule()
        if plan.preempted:
            self.preemptions.append((list(plan.preempted), running_before))
            # Blocks are short: a step that preempts admits nobody new.
            assert all(s.request in running_before for s in plan.scheduled)
        self.check(plan)
        self.log.append([(s.request, s.start_position, s.num_new_tokens) for s in plan.scheduled])
        self.sched.update_after_step(plan)
        for s in plan.scheduled:
            r = s.request
            assert r.num_computed_tokens <= r.num_tokens
            if r.num_computed_tokens == r.num_tokens:
                r.append_output(fake_token(r))
                if r.num_output_tokens >= r.max_output_tokens:
                    self.sched.finish(r, RequestStatus.FINISHED_LENGTH)
        self.check_ref_counts()
        self.plans.append(plan)
        return plan

    def run(self, max_steps: int = 500) -> None:
        for _ in range(max_steps):
            if not self.sched.has_work():
                return
            self.step()
        raise AssertionError("scheduler did not finish its work")

    def check(self, plan: SchedulerOutput) -> None:
        assert plan.num_tokens <= self.sched.max_num_batched_tokens
        assert len(self.sched.running) <= self.sched.max_num_seqs
        seen = set()
        for s in plan.scheduled:
            r = s.request
            assert r.request_id not in seen  # at most once per step
            seen.add(r.request_id)
            assert r in self.sched.running and r.status is RequestStatus.RUNNING
            assert s.num_new_tokens >= 1
            assert r.num_computed_tokens + s.num_new_tokens <= r.num_tokens
            assert len(r.block_table) * BS >= r.num_computed_tokens + s.num_new_tokens
        for r in plan.preempted:
            assert r.block_table == [] and r.num_computed_tokens == 0 and r in self.sched.waiting

    def check_ref_counts(self) -> None:
        pool = self.kv.pool
        live = [r for r in self.requests if r.block_table]
        for b in range(pool.num_blocks):
            assert pool.ref_counts[b] == sum(r.block_table.count(b) for r in live)
        for r in self.requests:
            if r.is_finished or r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                assert r.block_table == []

    def new_tokens(self, plan: SchedulerOutput) -> dict[str, int]:
        return {s.request.request_id: s.num_new_tokens for s in plan.scheduled}


def test_chunked_prefill_of_a_long_prompt_across_steps():
    sim = Sim(max_num_batched_tokens=8)
    r = req("long", range(30), max_tokens=3)
    sim.add(r)
    sim.run()
    starts = [start for (step,) in sim.log for _, start, _ in [step]]
    sizes = [n for (step,) in sim.log for _, _, n in [step]]
    assert sizes == [8, 8, 8, 6, 1, 1]
    assert starts == [0, 8, 16, 24, 30, 31]
    assert r.num_output_tokens == 3 and r.status is RequestStatus.FINISHED_LENGTH
    assert sim.kv.pool.num_free_blocks == sim.kv.pool.num_blocks


def test_long_prompt_never_stalls_running_decodes_and_decodes_come_first():
    sim = Sim(max_num_batched_tokens=10)
    a, b = req("a", range(3), max_tokens=12), req("b", range(50, 54), max_tokens=12)
    sim.add(a, b)
    sim.step()  # both prefilled in one step (7 tokens)
    assert a.num_output_tokens == 1 and b.num_output_tokens == 1
    long = req("long", range(100, 140), max_tokens=2)
    sim.add(long)
    chunk_steps = 0
    while not long.is_prefill_done:
        plan = sim.step()
        n = sim.new_tokens(plan)
        # Every running decode gets its token in every step, before any prefill chunk.
        assert n["a"] == 1 and n["b"] == 1
        kinds = [s.num_new_tokens == 1 for s in plan.scheduled]
        assert kinds == sorted(kinds, reverse=True)
        assert n["long"] == min(8, 40 - 8 * chunk_steps)  # the rest of the budget
        chunk_steps += 1
    assert chunk_steps == 5
    sim.run()
    assert all(r.status is RequestStatus.FINISHED_LENGTH for r in (a, b, long))


def test_token_budget_spreads_over_many_prompts_in_arrival_order():
    sim = Sim(max_num_batched_tokens=16)
    rs = [req(f"r{i}", range(10 * i, 10 * i + 7), max_tokens=2) for i in range(4)]
    sim.add(*rs)
    plan = sim.step()
    # FCFS: r0 and r1 whole (14), r2 gets the remaining 2 tokens as a chunk, r3 waits.
    assert [(s.request.request_id, s.num_new_tokens) for s in plan.scheduled] == [
        ("r0", 7), ("r1", 7), ("r2", 2)]
    assert rs[3].status is RequestStatus.WAITING
    plan = sim.step()
    # Then the two decodes, r2's remaining 5 tokens, and all of r3 (7 of the 9 left).
    assert [(s.request.request_id, s.num_new_tokens) for s in plan.scheduled] == [
        ("r0", 1), ("r1", 1), ("r2", 5), ("r3", 7)]
    sim.run()


def test_max_num_seqs_caps_the_batch_and_admits_first_come_first_served():
    sim = Sim(max_num_seqs=2, max_num_batched_tokens=64)
    lengths = [9, 2, 5, 3, 7]
    max_tokens = [3, 5, 2, 4, 2]
    rs = [req(f"r{i}", range(20 * i, 20 * i + n), max_tokens=m)
          for i, (n, m) in enumerate(zip(lengths, max_tokens))]
    sim.add(*rs)
    admitted_at: dict[str, int] = {}
    finished_at: dict[str, int] = {}
    step = 0
    while sim.sched.has_work():
        plan = sim.step()
        assert len(plan.scheduled) <= 2
        for s in plan.scheduled:
            admitted_at.setdefault(s.request.request_id, step)
        for r in rs:
            if r.is_finished:
                finished_at.setdefault(r.request_id, step)
        step += 1
    order = sorted(admitted_at, key=lambda k: (admitted_at[k], k))
    assert order == [r.request_id for r in rs]  # admitted in arrival order
    # A waiting request is admitted the step after a slot frees, never earlier.
    for later in rs[2:]:
        slots_freed = sorted(finished_at.values())
        assert admitted_at[later.request_id] >= slots_freed[0] + 1
    assert all(r.num_output_tokens == r.max_output_tokens for r in rs)


def test_fcfs_a_long_first_request_is_not_overtaken_by_short_ones():
    sim = Sim(max_num_batched_tokens=8)
    long = req("long", range(20), max_tokens=1)
    shorts = [req(f"s{i}", [100 + i, 200 + i], max_tokens=1) for i in range(3)]
    sim.add(long, *shorts)
    first_steps = []
    for _ in range(3):
        plan = sim.step()
        first_steps.append([s.request.request_id for s in plan.scheduled])
    # The long prompt takes the whole budget until its last chunk; only then do the
    # short ones start, in their order.
    assert first_steps[0] == ["long"] and first_steps[1] == ["long"]
    assert first_steps[2] == ["long", "s0", "s1"]
    sim.run()
    assert all(r.is_finished for r in sim.requests)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_preemption_when_blocks_run_out(prefix_caching):
    # 8 blocks of 4 = 32 token slots; 4 requests that each grow to 6 + 10 = 16 tokens.
    sim = Sim(num_blocks=8, max_num_batched_tokens=64, prefix_caching=prefix_caching)
    rs = [req(f"r{i}", range(10 * i, 10 * i + 6), max_tokens=10) for i in range(4)]
    sim.add(*rs)
    sim.run()
    assert sim.preemptions, "the pool is too small for all four: someone must be preempted"
    victims = set()
    for step_victims, running_before in sim.preemptions:
        remaining = list(running_before)
        for victim in step_victims:
            # The latest arrival among the (remaining) running requests goes first.
            assert victim is max(remaining, key=sim.requests.index)
            remaining.remove(victim)
            victims.add(victim.request_id)
    # Resumption recomputes the sequence so far (prompt + outputs): with prefix
    # caching its full blocks come from the cache, without it everything is redone.
    resumed = [(r, start, n) for step in sim.log for r, start, n in step
               if r.request_id in victims and n > 1 and start + n > r.num_prompt_tokens]
    assert resumed
    for r, start, n in resumed:
        assert start % BS == 0 and (start == 0 or prefix_caching)
    for r in rs:
        assert r.status is RequestStatus.FINISHED_LENGTH and r.num_output_tokens == 10
        # The outputs are what an unpreempted run produces (fake tokens are a pure
        # function of the sequence so far).
        alone = Sim()
        twin = req(r.request_id, r.prompt_token_ids, max_tokens=10)
        alone.add(twin)
        alone.run()
        assert twin.output_token_ids == r.output_token_ids
    assert sim.kv.pool.num_free_blocks == 8


def test_preempted_request_waits_at_the_front_and_resumes_first():
    sim = Sim(num_blocks=6, max_num_seqs=2, max_num_batched_tokens=64, prefix_caching=False)
    a, b = req("a", range(8), max_tokens=9), req("b", range(50, 58), max_tokens=9)
    c = req("c", [1, 2, 3], max_tokens=1)  # waits: two sequences at most
    sim.add(a, b, c)
    while not sim.preemptions:
        sim.step()
        assert c.status is RequestStatus.WAITING
    (victims, _), = sim.preemptions
    assert victims == [b] and b.status is RequestStatus.PREEMPTED
    assert list(sim.sched.waiting) == [b, c]  # ahead of c, which arrived later
    preempted_at = len(sim.log)
    sim.run()
    # After the preemption, b resumes before c starts (in the same step at the latest).
    after = [r.request_id for step in sim.log[preempted_at:] for r, _, _ in step if r is not a]
    assert after.index("b") < after.index("c")
    assert all(r.is_finished for r in (a, b, c))
    assert sim.kv.pool.num_free_blocks == 6


def test_prefix_cache_hit_counts_full_shared_blocks_only():
    sim = Sim()
    a = req("a", range(10), max_tokens=2)
    sim.add(a)
    sim.run()
    assert a.num_cached_tokens == 0

    b = req("b", list(range(9)) + [77, 78], max_tokens=2)  # shares 9 tokens: 2 full blocks
    sim.add(b)
    sim.step()
    assert b.num_cached_tokens == 8
    assert [(r.request_id, start, n) for r, start, n in sim.log[-1]] == [("b", 8, 3)]

    same = req("same", range(10), max_tokens=2)  # identical: 2 full blocks, tail computed
    sim.add(same)
    sim.step()
    assert same.num_cached_tokens == 8

    exact = req("exact", range(8), max_tokens=2)  # 2 full blocks, but the last token is
    sim.add(exact)                                # always computed: only 1 block hits
    plan = sim.step()
    assert exact.num_cached_tokens == 4
    assert sim.new_tokens(plan)["exact"] == 4
    sim.run()
    assert sim.kv.pool.num_free_blocks == sim.kv.pool.num_blocks


def test_prefix_hit_on_blocks_of_a_running_request():
    sim = Sim(max_num_batched_tokens=64)
    a = req("a", range(12), max_tokens=6)
    sim.add(a)
    sim.step()
    b = req("b", range(13), max_tokens=3)  # a's 12-token prompt is 3 full blocks
    sim.add(b)
    sim.step()
    assert b.num_cached_tokens == 12
    assert b.block_table[:3] == a.block_table[:3]
    assert all(sim.kv.pool.ref_counts[blk] == 2 for blk in a.block_table[:3])
    sim.run()
    assert sim.kv.pool.num_free_blocks == sim.kv.pool.num_blocks


def test_eviction_under_pressure_reuses_oldest_free_blocks():
    sim = Sim(num_blocks=6, max_num_batched_tokens=64)
    first = req("first", range(9), max_tokens=1)  # 3 blocks, 2 full and cached
    second = req("second", range(100, 109), max_tokens=1)
    sim.add(first)
    sim.run()
    sim.add(second)
    sim.run()
    # Every block has been used; the free queue holds first's 3 blocks (oldest), then
    # second's. A new 3-block prompt must evict first's, not second's.
    third = req("third", range(200, 209), max_tokens=1)
    sim.add(third)
    sim.run()
    again_first = req("again_first", range(9), max_tokens=1)
    again_second = req("again_second", range(100, 109), max_tokens=1)
    sim.add(again_second)
    sim.run()
    sim.add(again_first)
    sim.run()
    assert again_second.num_cached_tokens == 8  # recently used: survived
    assert again_first.num_cached_tokens == 0  # oldest: evicted


def test_finish_and_abort_return_every_block():
    sim = Sim(num_blocks=16, max_num_batched_tokens=8)
    a = req("a", range(10), max_tokens=20)
    b = req("b", range(10), max_tokens=20)  # shares a's prefix
    c = req("c", range(30, 50), max_tokens=20)  # still prefilling when aborted
    d = req("d", range(60, 64), max_tokens=20)  # still waiting when aborted
    sim.add(a, b, c, d)
    for _ in range(3):
        sim.step()
    assert c in sim.sched.running and not c.is_prefill_done and c.block_table
    assert d in sim.sched.waiting
    for r in (c, d, a):
        sim.sched.finish(r, RequestStatus.FINISHED_ABORTED)
        assert r.block_table == [] and r.status is RequestStatus.FINISHED_ABORTED
        sim.check_ref_counts()
    assert sim.sched.running == [b]
    sim.run()
    assert b.status is RequestStatus.FINISHED_LENGTH
    assert sim.kv.pool.num_free_blocks == 16
    assert not sim.sched.has_work()


def test_n_siblings_wait_for_the_first_prefill_then_share_its_blocks():
    sim = Sim(max_num_batched_tokens=8)
    prompt = list(range(17))  # 4 full blocks + 1 token
    first = req("g#0", prompt, max_tokens=3)
    siblings = [req(f"g#{i}", prompt, max_tokens=3, prefix_source=first) for i in (1, 2)]
    other = req("other", [500, 501], max_tokens=1)
    sim.add(first, *siblings, other)
    steps_until_first_done = 0
    while not first.is_prefill_done:
        plan = sim.step()
        steps_until_first_done += 1
        ids = [s.request.request_id for s in plan.scheduled]
        if not first.is_prefill_done:
            assert "g#1" not in ids and "g#2" not in ids
    assert steps_until_first_done == 3  # 8 + 8 + 1
    assert other.num_computed_tokens > 0  # not blocked behind the waiting siblings
    sim.run()
    for s in siblings:
        assert s.num_cached_tokens == 16
        assert s.num_output_tokens == 3
    # The siblings computed only the last prompt token each: prompt computed once.
    sibling_prefill = [n for step in sim.log for r, start, n in step
                       if r in siblings and start < 17]
    assert sibling_prefill == [1, 1]
    assert sim.kv.pool.num_free_blocks == sim.kv.pool.num_blocks


@pytest.mark.parametrize("seed", range(12))
def test_random_workloads_keep_every_invariant(seed):
    """Random arrivals, lengths, budgets and pool sizes: every step keeps the
    invariants (Sim.check), everything finishes with the tokens it gets alone,
    and the pool is whole again at the end."""
    import random

    rng = random.Random(seed)
    num_blocks = rng.randint(6, 16)
    sim = Sim(num_blocks=num_blocks, max_num_seqs=rng.randint(1, 6),
              max_num_batched_tokens=rng.choice([4, 7, 16, 64]), prefix_caching=bool(seed % 2))
    shared = [rng.randrange(100) for _ in range(12)]
    pending = []
    for i in range(rng.randint(3, 10)):
        prompt = (shared[:rng.randint(0, 12)] + [rng.randrange(100) for _ in range(rng.randint(1, 12))])
        max_tokens = rng.randint(1, max(1, min(12, num_blocks * BS - len(prompt))))
        pending.append((rng.randint(0, 15), req(f"r{i}", prompt, max_tokens=max_tokens)))
    step = 0
    while pending or sim.sched.has_work():
        for arrival, r in [p for p in pending if p[0] <= step]:
            sim.add(r)
            pending.remove((arrival, r))
        if rng.random() < 0.05 and sim.sched.running:
            victim = rng.choice(sim.sched.running)  # abort at any moment
            sim.sched.finish(victim, RequestStatus.FINISHED_ABORTED)
        sim.step()
        step += 1
        assert step < 1000
    for r in sim.requests:
        if r.status is RequestStatus.FINISHED_ABORTED:
            continue
        assert r.status is RequestStatus.FINISHED_LENGTH
        twin = req(r.request_id, r.prompt_token_ids, max_tokens=r.max_output_tokens)
        alone = Sim()
        alone.add(twin)
        alone.run()
        assert twin.output_token_ids == r.output_token_ids
    assert sim.kv.pool.num_free_blocks == num_blocks
