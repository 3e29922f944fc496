"""Iteration-level scheduling under a token budget.

One rule: each request's `num_computed_tokens` chases its `num_tokens`. A step
gives every scheduled request `num_new_tokens` more, up to the step's budget, so a
decode is a request one token behind, a prefill is a request far behind (computed
in chunks when the budget is smaller), and a prefix hit starts a request ahead.

Order: running requests first, decodes before prefill chunks (a long prompt never
stalls the running decodes), then waiting requests first come, first served. When
blocks run out, the most recently admitted running request is preempted (the last
of `running`: admission and readmission append there): its blocks are freed and it waits again at the front of the queue, to be recomputed (often
from the prefix cache) when blocks return.

An encoder (bidirectional attention, no KV cache: `whole_sequences`) can only compute
a sequence whole, in one step: each request is scheduled with all of its tokens and
takes no blocks, admitted while the budget holds it (one longer than the whole
budget runs alone), and is done after that one step. Pooling requests on a decoder
are ordinary requests here: they end when their prompt is computed.

The scheduler plans; the model runner executes; `update_after_step` advances the
counters. Nothing here touches a tensor, so it is tested without a model.
"""

import time
from collections import deque
from dataclasses import dataclass, field

from amity.engine.kv_cache_manager import KVCacheManager
from amity.engine.request import Request, RequestStatus


@dataclass
class ScheduledRequest:
    request: Request
    num_new_tokens: int

    @property
    def start_position(self) -> int:
        return self.request.num_computed_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_seqs: int, max_num_batched_tokens: int,
                 whole_sequences: bool = False):
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.whole_sequences = whole_sequences
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        if self.whole_sequences:
            return self._schedule_whole()
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        # Decodes first: a stable sort keeps arrival order within each kind.
        for request in sorted(self.running, key=lambda r: r.num_tokens - r.num_computed_tokens > 1):
            if request not in self.running:
                continue  # preempted earlier in this loop
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if num_new <= 0:
                continue
            while True:
                if self.kv.allocate(request, request.num_computed_tokens + num_new):
                    out.scheduled.append(ScheduledRequest(request, num_new))
                    budget -= num_new
                    break
                victim = self.running[-1]
                budget += self._preempt(victim, out)
                if victim is request:
                    break
        if out.preempted:
            return out  # blocks are short: admit nothing new this step

        skipped: list[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting.popleft()
            source = request.prefix_source
            if source is not None and not (source.is_prefill_done or source.is_finished):
                skipped.append(request)  # wait to share the sibling's prompt blocks
                continue
            cached = self.kv.find_cached_blocks(request)
            num_cached = len(cached) * self.kv.block_size
            num_new = min(request.num_tokens - num_cached, budget)
            if not self.kv.allocate(request, num_cached + num_new, cached):
                self.waiting.appendleft(request)
                break
            request.num_computed_tokens = num_cached
            if request.num_cached_tokens is None:
                request.num_cached_tokens = min(num_cached, request.num_prompt_tokens)
            request.status = RequestStatus.RUNNING
            if request.first_scheduled_time is None:
                request.first_scheduled_time = time.monotonic()
            self.running.append(request)
            out.scheduled.append(ScheduledRequest(request, num_new))
            budget -= num_new
        self.waiting.extendleft(reversed(skipped))
        return out

    def _schedule_whole(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            num_new = request.num_tokens
            if num_new > budget and out.scheduled:
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            request.num_cached_tokens = 0
            request.first_scheduled_time = time.monotonic()
            self.running.append(request)
            out.scheduled.append(ScheduledRequest(request, num_new))
            budget -= num_new
        return out

    def _preempt(self, request: Request, out: SchedulerOutput) -> int:
        """Preempt; returns the budget it had taken in this step, if any."""
        returned = 0
        for s in out.scheduled:
            if s.request is request:
                out.scheduled.remove(s)
                returned = s.num_new_tokens
                break
        self.running.remove(request)
        self.kv.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)
        out.preempted.append(request)
        return returned

    def update_after_step(self, out: SchedulerOutput) -> None:
        """Count the scheduled tokens as computed and publish full blocks."""
        for s in out.scheduled:
            s.request.num_computed_tokens += s.num_new_tokens
            self.kv.cache_full_blocks(s.request)

    def finish(self, request: Request, status: RequestStatus) -> None:
        """End a request, running or waiting, and return its blocks."""
        request.status = status
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.kv.free(request)
