"""Whisper's timestamp tokens, as `transformers` generates and reads them in long-form
transcription (its `WhisperTimeStampLogitsProcessor` and `_retrieve_segment`; OpenAI's
`ApplyTimestampRules` and `transcribe` before it).

A window's output is segments of text between timestamp tokens (`<|0.00|>` ..
`<|30.00|>`, 20 ms apart): `<|0.00|> text<|2.40|><|2.40|> more text<|5.10|>`. The rules
keep that shape while decoding; `split_window` then reads where the next window starts.
"""

from dataclasses import dataclass

import torch

# OpenAI's max_initial_timestamp (1.0 s), in timestamp positions: the first segment
# starts within the window's first second.
MAX_INITIAL_TIMESTAMP_INDEX = 50
FRAMES_PER_TIMESTAMP = 2  # a timestamp step is 20 ms, two 10 ms log-mel frames


@dataclass(frozen=True)
class TimestampTokens:
    eot: int  # <|endoftext|>: every text token is below it
    no_timestamps: int
    begin: int  # <|0.00|>; timestamps are begin .. vocab end


def apply_timestamp_rules(scores: torch.Tensor, outputs: list[list[int]], tokens: TimestampTokens) -> torch.Tensor:
    """Mask `scores` [rows, vocab] (suppress tokens already applied) for rows whose window
    output so far is `outputs[row]`: timestamps in pairs (a text segment opens and closes
    with one; only <|endoftext|> may follow a lone closing one), never decreasing, the first
    token a timestamp of at most MAX_INITIAL_TIMESTAMP_INDEX, and a timestamp whenever the
    timestamps together are likelier than any single text token."""
    scores = scores.clone()
    scores[:, tokens.no_timestamps] = -float("inf")
    begin = tokens.begin
    for row, seq in enumerate(outputs):
        last_was_timestamp = len(seq) >= 1 and seq[-1] >= begin
        penultimate_was_timestamp = len(seq) < 2 or seq[-2] >= begin
        if last_was_timestamp:
            if penultimate_was_timestamp:  # a pair just closed: text (or the end) next
                scores[row, begin:] = -float("inf")
            else:  # a segment just closed: its pair, or the end
                scores[row, :tokens.eot] = -float("inf")
        timestamps = [t for t in seq if t >= begin]
        if timestamps:
            # A pair repeats its timestamp; otherwise strictly later (no second <|0.00|>).
            lowest = timestamps[-1] if last_was_timestamp and not penultimate_was_timestamp else timestamps[-1] + 1
            scores[row, begin:lowest] = -float("inf")
        if not seq:
            scores[row, :begin] = -float("inf")
            scores[row, begin + MAX_INITIAL_TIMESTAMP_INDEX + 1:] = -float("inf")
    logprobs = torch.log_softmax(scores.float(), dim=-1)
    timestamp_logprob = logprobs[:, begin:].logsumexp(dim=-1)
    best_text_logprob = logprobs[:, :begin].max(dim=-1).values
    scores[:, :begin].masked_fill_((timestamp_logprob > best_text_logprob)[:, None], -float("inf"))
    return scores


def split_window(output: list[int], begin: int, window_frames: int) -> tuple[list[list[int]], int]:
    """A finished window's output (its <|endoftext|> removed) -> (the segments kept, the
    log-mel frames to seek forward). Ending on a lone timestamp (or with no pair at all)
    the whole window is done; otherwise the text after the last pair is an unfinished
    segment cut by the window's end: it is dropped and the next window starts at that
    pair's timestamp."""
    is_timestamp = [t >= begin for t in output]
    single_ending = is_timestamp[-2:] == [False, True]
    pair_ends = [i + 1 for i in range(len(output) - 1) if is_timestamp[i] and is_timestamp[i + 1]]
    if not pair_ends:
        return [output], window_frames
    slices = pair_ends + [len(output)] if single_ending else pair_ends[:-1] + [pair_ends[-1] + 1]
    segments, start = [], 0
    for end in slices:
        segments.append(output[start:end])
        start = end
    if single_ending:
        return segments, window_frames
    return segments, (output[start - 2] - begin) * FRAMES_PER_TIMESTAMP


def conditioning_tokens(segments: list[list[int]], begin: int) -> list[int]:
    """The segments as the next window's previous text: a segment closed by a pair keeps
    one of its two timestamps (transformers' `skip_ending_double_timestamps`)."""
    out = []
    for segment in segments:
        out += segment[:-1] if len(segment) > 2 and segment[-2] >= begin else segment
    return out
