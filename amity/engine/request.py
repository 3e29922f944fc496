"""A request's state inside the engine: one sequence being generated, or a pooling
request (`Request.pooling`: a prompt whose hidden states become a vector or class
probabilities, see pooler.py).

A Friendli request with `n` choices becomes `n` engine requests (one per choice)
that share a `group_id`. The scheduling rule lives on `num_computed_tokens`: it
chases `num_tokens` (prompt + output so far); prefill, chunked prefill, prefix
hits and recomputation after preemption are all that one rule.

`ValidatedRequest` is a request as `LLMEngine.validate` hands it on: checked, with
its grammar compiled, ready for the engine thread to build its choices from.
"""

import enum
import time
from dataclasses import dataclass, field

import torch

from amity.engine.pooling_params import PoolingParams
from amity.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class ValidatedRequest:
    """A request `LLMEngine.validate` accepted, with what adding it needs already
    worked out, so that the engine thread only builds its choices from it."""

    prompt_token_ids: list[int]
    params: SamplingParams
    max_output_tokens: int
    min_output_tokens: int
    eos_token_ids: frozenset[int]  # params.eos_token, or the model's
    replaced_embeddings: dict[int, torch.Tensor]  # {prompt position: input embedding}
    grammar: object | None  # the compiled grammar (structured_output); None when unconstrained


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                        RequestStatus.FINISHED_ABORTED)


@dataclass(eq=False)  # an entity: list membership and removal go by identity
class Request:
    request_id: str
    group_id: str
    choice_index: int
    prompt_token_ids: list[int]
    params: SamplingParams | PoolingParams  # PoolingParams: a pooling request (`pooling`)
    seed: int
    eos_token_ids: frozenset[int]
    max_output_tokens: int
    min_output_tokens: int
    # Prompt positions whose input embedding is replaced: {position: vector}.
    replaced_embeddings: dict[int, torch.Tensor] = field(default_factory=dict)
    # Forced tokens are computed as a prompt extension (one pass), and scored.
    forced_token_ids: list[int] = field(default_factory=list)
    # The sibling whose prompt computation this one waits for, so that n > 1
    # choices compute the prompt once and share its cached blocks.
    prefix_source: "Request | None" = None

    # The tokens whose K/V the request computes, as one list that only grows: the
    # prompt, then each output token as it is appended; with forced output, the
    # prompt and all forced tokens but the last (each predicts the next), fixed.
    # Per-step code reads its length and slices of it, never a rebuilt copy.
    all_token_ids: list[int] = field(init=False)
    num_prompt_tokens: int = field(init=False)
    num_output_tokens: int = field(init=False, default=0)
    num_computed_tokens: int = 0
    num_cached_tokens: int | None = None  # prompt tokens served from the prefix cache
    block_table: list[int] = field(default_factory=list)
    num_published_blocks: int = 0  # of block_table, already offered to the prefix cache
    block_hashes: list[bytes] = field(default_factory=list)  # chained, one per full block
    status: RequestStatus = RequestStatus.WAITING
    arrival_time: float = field(default_factory=time.monotonic)
    first_scheduled_time: float | None = None  # when it first left the waiting queue
    generator: torch.Generator | None = None
    # Structured output (issue 5): the request's grammar matcher (a
    # structured_output.GrammarMatcher), advanced with each sampled token; set when the
    # grammar refused a sampled token (the output then ends as `length`).
    grammar: object | None = None
    grammar_failed: bool = False
    stop_reason: str | tuple[int, ...] | None = None  # see outputs.CompletionOutput
    # A pooling request: the prompt positions whose hidden states its output reads
    # (the engine's Pooler says which); None for a generation request.
    pooled_positions: range | None = None
    # Its LoRA adapter's slot in the model (-1: the base model) and the key that roots
    # its prefix-cache hashes (None for the base), set when the engine adds it.
    adapter_slot: int = -1
    adapter_cache_key: bytes | None = None

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.all_token_ids = self.prompt_token_ids + self.forced_token_ids[:-1]
        if not self.is_pooling and not self.params.is_greedy:
            self.generator = torch.Generator().manual_seed(self.seed)

    @classmethod
    def pooling(cls, request_id: str, prompt_token_ids: list[int], params: PoolingParams,
                pooled_positions: range) -> "Request":
        """A request that is only a prompt: it samples nothing and emits no token."""
        return cls(request_id=request_id, group_id=request_id, choice_index=0,
                   prompt_token_ids=prompt_token_ids, params=params, seed=0, eos_token_ids=frozenset(),
                   max_output_tokens=0, min_output_tokens=0, pooled_positions=pooled_positions)

    @property
    def is_pooling(self) -> bool:
        return self.pooled_positions is not None

    def append_output(self, token_id: int) -> None:
        """Count one more output token (forced ones are already in `all_token_ids`)."""
        if not self.forced_token_ids:
            self.all_token_ids.append(token_id)
        self.num_output_tokens += 1

    @property
    def output_token_ids(self) -> list[int]:
        """A copy, for reports and tests; per-step code reads `all_token_ids`."""
        if self.forced_token_ids:
            return self.forced_token_ids[:self.num_output_tokens]
        return self.all_token_ids[self.num_prompt_tokens:]

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def first_logit_position(self) -> int:
        """The position whose logits give the next output token: from here on,
        positions still owe an output (the last token normally, every forced
        position not yet scored with forced output). Positions before it have
        emitted theirs: recomputing them after a preemption emits nothing again,
        and they alone may come from the prefix cache."""
        return self.num_prompt_tokens - 1 + self.num_output_tokens

    @property
    def first_owed_position(self) -> int:
        """The first position whose output is still owed (its logits, or for a pooling
        request its hidden state): it and what follows are computed, never read
        from the prefix cache."""
        if self.pooled_positions is not None:
            return self.pooled_positions.start
        return self.first_logit_position

    @property
    def cacheable_prefix_len(self) -> int:
        """Tokens whose K/V depend only on the token ids; replaced embeddings
        change K/V, so blocks from the first replaced position on are never
        looked up or published."""
        if self.replaced_embeddings:
            return min(self.replaced_embeddings)
        return self.num_tokens

    @property
    def is_prefill_done(self) -> bool:
        return self.num_computed_tokens >= self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished
