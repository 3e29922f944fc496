"""Whisper's temperature fallback (OpenAI's `transcribe`, faster-whisper and transformers
alike): a window whose output looks degenerate (repetitive text, or tokens the model was
unsure of) is decoded again at the next, higher temperature; the last try is kept
whatever it looks like."""

import zlib

TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
COMPRESSION_RATIO_THRESHOLD = 2.4  # text that gzip shrinks more than this repeats itself
LOGPROB_THRESHOLD = -1.0  # mean log-probability of the window's tokens, <|endoftext|> included
# After a window decoded this hot, the next window is not conditioned on the text so far.
PROMPT_RESET_TEMPERATURE = 0.5


def temperature_schedule(temperature: float) -> tuple[float, ...]:
    """The request's temperature first, then the schedule's hotter steps."""
    return (temperature, *(t for t in TEMPERATURES if t > temperature))


def compression_ratio(text: str) -> float:
    """OpenAI's measure: the text's UTF-8 bytes over their zlib-compressed size."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def needs_fallback(text: str, sum_logprob: float, num_tokens: int) -> bool:
    return (compression_ratio(text) > COMPRESSION_RATIO_THRESHOLD
            or sum_logprob / max(num_tokens, 1) < LOGPROB_THRESHOLD)
