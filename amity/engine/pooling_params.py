"""What a pooling request asks for: the prompt's vector ("embed") or its class
probabilities ("classify"), instead of generated tokens.

A pooling request is only a prompt. It goes through the same scheduler and token
budget as generation and finishes in the step that computes its last prompt token;
which hidden rows it reads and how they become its output is the model's (the
engine's `Pooler`), not the request's.
"""

from dataclasses import dataclass

POOLING_TASKS = ("embed", "classify")


@dataclass(frozen=True)
class PoolingParams:
    task: str  # one of POOLING_TASKS
    # The route of the LoRA adapter to compute with, as SamplingParams.adapter; None: the base model.
    adapter: str | None = None

    def __post_init__(self):
        if self.task not in POOLING_TASKS:
            raise ValueError(f"pooling task {self.task!r} is not one of {POOLING_TASKS}")


@dataclass(frozen=True)
class ValidatedPooling:
    """A pooling input `LLMEngine.validate_pooling` accepted, ready to queue."""

    prompt_token_ids: list[int]
    params: PoolingParams
