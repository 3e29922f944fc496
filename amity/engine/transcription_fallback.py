"""Whisper's temperature fallback (OpenAI's `transcribe`, faster-whisper and transformers
alike): a window whose output looks degenerate (repetitive text, or tokens the model was
unsure of) is decoded again at the next, higher temperature. When every temperature
fails, faster-whisper's choice: the likeliest try among those that do not repeat
themselves (or among all)."""

import zlib
from dataclasses import dataclass

TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
COMPRESSION_RATIO_THRESHOLD = 2.4  # text that zlib shrinks more than this repeats itself
LOGPROB_THRESHOLD = -1.0  # mean log-probability of the window's tokens, <|endoftext|> included
# After a window decoded this hot, the next window is not conditioned on the text so far.
PROMPT_RESET_TEMPERATURE = 0.5


def temperature_schedule(temperature: float) -> tuple[float, ...]:
    """The request's temperature first, then the schedule's hotter steps."""
    return (temperature, *(t for t in TEMPERATURES if t > temperature))


def compression_ratio(text: str) -> float:
    """OpenAI's measure: the text's UTF-8 bytes over their zlib-compressed size."""
    data = text.strip().encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


@dataclass(frozen=True)
class Attempt:
    """One try at a window."""

    token_ids: list[int]  # generated, <|endoftext|> included
    text: str
    sum_logprob: float

    @property
    def avg_logprob(self) -> float:
        return self.sum_logprob / max(len(self.token_ids), 1)

    @property
    def repetitive(self) -> bool:
        return compression_ratio(self.text) > COMPRESSION_RATIO_THRESHOLD

    @property
    def acceptable(self) -> bool:
        return not self.repetitive and self.avg_logprob >= LOGPROB_THRESHOLD


def best_attempt(attempts: list[Attempt]) -> Attempt:
    """Every try failed: the likeliest of those that do not repeat themselves, or of all."""
    return max([a for a in attempts if not a.repetitive] or attempts, key=lambda a: a.avg_logprob)
