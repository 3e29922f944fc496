"""What the engine hands back after each step, as plain data.

Outputs are deltas: each step reports the tokens, text and logprobs that are new
for each choice that moved. Streaming forwards them as they come; `FinalOutput`
accumulates them for a non-streaming response.
"""

from dataclasses import dataclass, field

import torch


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    # The top alternatives at this position, most likely first: (token_id, logprob).
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class CompletionOutput:
    index: int  # the choice index within the request (0 .. n-1)
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[TokenLogprob] | None
    finish_reason: str | None  # None while running; then "stop" or "length"
    seed: int
    num_output_tokens: int  # total so far, not only the new ones
    # Which stop ended the choice: the stop string, or the stop-token sequence;
    # None for EOS, length, a grammar's end, forced output, or while running.
    stop_reason: str | tuple[int, ...] | None = None


@dataclass
class RequestOutput:
    request_id: str
    outputs: list[CompletionOutput]  # the choices that moved this step
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    finished: bool  # every choice has finished
    # Seconds between the engine receiving the request and first scheduling any of
    # its choices; None while all of them wait.
    queued_seconds: float | None = None


@dataclass
class PoolingOutput:
    """A pooling request's one and only output, when its prompt is computed."""

    request_id: str
    data: torch.Tensor  # float32 [dim]: the embedding, or the probabilities in label-id order
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    finished: bool = True  # as RequestOutput's: the stream ends here


@dataclass
class FinalChoice:
    index: int
    seed: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    stop_reason: str | tuple[int, ...] | None = None


@dataclass
class FinalOutput:
    """The accumulation of a request's stream of `RequestOutput` deltas."""

    request_id: str
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    choices: dict[int, FinalChoice] = field(default_factory=dict)
    finished: bool = False

    def add(self, step: RequestOutput) -> None:
        self.num_prompt_tokens = step.num_prompt_tokens
        self.num_cached_tokens = step.num_cached_tokens
        self.finished = step.finished
        for out in step.outputs:
            choice = self.choices.setdefault(out.index, FinalChoice(out.index, out.seed))
            choice.text += out.new_text
            choice.token_ids.extend(out.new_token_ids)
            if out.new_logprobs is not None:
                choice.logprobs = (choice.logprobs or []) + out.new_logprobs
            if out.finish_reason is not None:
                choice.finish_reason = out.finish_reason
                choice.stop_reason = out.stop_reason

    @property
    def ordered_choices(self) -> list[FinalChoice]:
        return [self.choices[i] for i in sorted(self.choices)]

    @property
    def num_output_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.choices.values())
