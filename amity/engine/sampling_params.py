"""Per-request generation controls, as plain data.

The field names are the Friendli wire names (see ../shared/spec/completions.md);
the server copies wire fields onto this dataclass in one translation step and the
engine never sees pydantic. Text-level inputs (`bad_words`) are tokenized by the
server into their token form (`bad_word_tokens`) before they get here.
"""

import math
from dataclasses import dataclass, field, fields

from amity.engine.errors import RequestError
from amity.engine.structured_output import StructuredOutputSpec


# Choices one request may ask for. Each is a sequence in the engine's queue: without
# a cap, one request with a huge `n` fills the queue and starves everyone else.
MAX_CHOICES_PER_REQUEST = 128

# Temperatures below this sample as greedy (vLLM's value): dividing logits by a
# tiny positive temperature overflows to inf and the draw picks garbage.
GREEDY_TEMPERATURE_EPS = 1e-5


@dataclass
class SamplingParams:
    n: int = 1
    # 0 (or below GREEDY_TEMPERATURE_EPS) means greedy (argmax); the spec's default is 1.0.
    temperature: float = 1.0
    top_k: int = 0  # 0 disables
    top_p: float = 1.0
    min_p: float = 0.0
    xtc_threshold: float = 0.0
    xtc_probability: float = 0.0  # 0 disables XTC

    repetition_penalty: float = 1.0  # HF semantics: prompt + output tokens
    frequency_penalty: float = 0.0  # OpenAI semantics: output tokens only
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    no_repeat_ngram: int = 1  # 1 disables
    bad_word_tokens: list[list[int]] = field(default_factory=list)

    stop: list[str] = field(default_factory=list)
    stop_tokens: list[list[int]] = field(default_factory=list)
    # Replaces the model's EOS set when given.
    eos_token: list[int] | None = None
    max_tokens: int | None = None
    max_total_tokens: int | None = None
    min_tokens: int = 0
    min_total_tokens: int | None = None

    # An int, or one seed per choice. None: the engine draws one per choice
    # and reports it in the output.
    seed: int | list[int] | None = None

    # Number of top alternatives to report per position (0: only the chosen
    # token's logprob). None: no logprobs.
    logprobs: int | None = None
    forced_output_tokens: list[int] | None = None

    # Encoder-decoder only; a decoder-only model refuses non-default values.
    encoder_no_repeat_ngram: int = 1
    encoder_repetition_penalty: float = 1.0

    skip_special_tokens: bool = True

    # The route of the LoRA adapter to compute with (LLMEngine's lora_manager); None: the base model.
    adapter: str | None = None

    # Structured output (issue 5): the grammar the output must follow; None or kind
    # "text" constrains nothing.
    structured_output: StructuredOutputSpec | None = None

    def __post_init__(self) -> None:
        self._validate()

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS

    def seed_for_choice(self, index: int) -> int | None:
        """The seed of choice `index`: a list gives one per choice; an int seeds
        choice i with seed + i so that n > 1 choices differ yet reproduce."""
        if self.seed is None:
            return None
        if isinstance(self.seed, list):
            return self.seed[index]
        return self.seed + index

    def _validate(self) -> None:
        def check(ok: bool, name: str, message: str) -> None:
            if not ok:
                raise RequestError(f"`{name}` {message}", name)

        # NaN passes no range test below but inf passes some (temperature >= 0), and
        # either would poison the logits: every float control is finite.
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float):
                check(math.isfinite(value), f.name, "must be a finite number")
        for token, bias in (self.logit_bias or {}).items():
            check(math.isfinite(bias), "logit_bias", f"for token {token} must be a finite number")
        check(1 <= self.n <= MAX_CHOICES_PER_REQUEST, "n",
              f"must be between 1 and {MAX_CHOICES_PER_REQUEST}")
        check(self.temperature >= 0.0, "temperature", "must be >= 0")
        check(self.top_k >= 0, "top_k", "must be >= 0 (0 disables top-k)")
        check(0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]")
        check(0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]")
        check(0.0 <= self.xtc_threshold <= 1.0, "xtc_threshold", "must be in [0, 1]")
        check(0.0 <= self.xtc_probability <= 1.0, "xtc_probability", "must be in [0, 1]")
        check(self.repetition_penalty > 0.0, "repetition_penalty", "must be positive")
        check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]")
        check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]")
        check(self.no_repeat_ngram >= 1, "no_repeat_ngram", "must be >= 1 (1 disables)")
        check(
            not (self.max_tokens is not None and self.max_total_tokens is not None),
            "max_tokens",
            "and `max_total_tokens` cannot both be set; give only one",
        )
        check(
            not (self.min_tokens and self.min_total_tokens is not None),
            "min_tokens",
            "and `min_total_tokens` cannot both be set; give only one",
        )
        check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be >= 1")
        check(
            self.max_total_tokens is None or self.max_total_tokens >= 1,
            "max_total_tokens",
            "must be >= 1",
        )
        check(self.min_tokens >= 0, "min_tokens", "must be >= 0")
        check(
            self.min_total_tokens is None or self.min_total_tokens >= 0,
            "min_total_tokens",
            "must be >= 0",
        )
        check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            "must not exceed `max_tokens`",
        )
        check(self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs", "must be in [0, 20]")
        if isinstance(self.seed, list):
            check(
                len(self.seed) == self.n,
                "seed",
                f"list has {len(self.seed)} entries but n is {self.n}; give one seed per choice",
            )
        for seq in self.bad_word_tokens:
            check(len(seq) > 0, "bad_word_tokens", "entries must not be empty")
        for seq in self.stop_tokens:
            check(len(seq) > 0, "stop_tokens", "entries must not be empty")
        check(
            self.forced_output_tokens is None or len(self.forced_output_tokens) > 0,
            "forced_output_tokens",
            "must not be empty",
        )
        # Structured output (issue 5): the spec makes `min_tokens` unsupported with it.
        if self.structured_output is not None and self.structured_output.constrains:
            check(not self.min_tokens and self.min_total_tokens is None, "min_tokens",
                  "is unsupported together with `response_format`; drop one of them")
            what = self.structured_output.field
            check(self.forced_output_tokens is None, "forced_output_tokens",
                  f"cannot be combined with `{what}`; drop one of them")
            # A stop would end the output where the grammar may not end (a `}` cut off
            # a JSON object): a finished constrained output must always be complete.
            check(not self.stop, "stop", f"cannot be combined with `{what}`: the output "
                  "ends where its grammar ends; drop `stop`")
            check(not self.stop_tokens, "stop_tokens", f"cannot be combined with `{what}`: "
                  "the output ends where its grammar ends; drop `stop_tokens`")
