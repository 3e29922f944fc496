"""Splitting a document into token-sized chunks with overlap.

The units are sentences (a run of text ending in `.`, `!` or `?` before whitespace,
or at the end of a line); a unit longer than a chunk is cut at word boundaries
(a word longer than a chunk, between characters).
Chunks are runs of whole units of at most `max_tokens` tokens, counted unit by unit
with the embedder's tokenizer; each chunk after the first starts with the last units
of the one before it, as many as fit in `overlap_tokens`. A chunk's text is the
document's own text from its first unit to its last (line breaks kept).
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

SENTENCE = re.compile(r"\S.*?(?:[.!?]+(?=\s)|$)", re.M)
WORD = re.compile(r"\S+")

# Token counts of several texts at once (without special tokens).
CountTokens = Callable[[list[str]], list[int]]


@dataclass(frozen=True)
class Unit:
    start: int
    end: int
    tokens: int


def _split_long(text: str, start: int, end: int, max_tokens: int, count: CountTokens) -> list[Unit]:
    """Cut text[start:end] at word boundaries into pieces of at most max_tokens tokens,
    halving until they fit; a word longer than that is cut between characters."""
    words = [(start + m.start(), start + m.end()) for m in WORD.finditer(text[start:end])]
    pending, done = [words], []
    while pending:
        group = pending.pop()
        [tokens] = count([text[group[0][0]:group[-1][1]]])
        if tokens <= max_tokens or group[-1][1] - group[0][0] == 1:  # (one character stays)
            done.append(Unit(group[0][0], group[-1][1], tokens))
        elif len(group) > 1:
            half = len(group) // 2
            pending += [group[half:], group[:half]]  # the first half is popped first
        else:
            (a, b), = group
            pending.append([(i, i + 1) for i in range(a, b)])
    return done


def units(text: str, max_tokens: int, count: CountTokens) -> list[Unit]:
    spans = [(m.start(), m.end()) for m in SENTENCE.finditer(text)]
    counts = count([text[s:e] for s, e in spans]) if spans else []
    out: list[Unit] = []
    for (start, end), tokens in zip(spans, counts, strict=True):
        if tokens <= max_tokens:
            out.append(Unit(start, end, tokens))
        else:
            out += _split_long(text, start, end, max_tokens, count)
    return out


def chunk(text: str, max_tokens: int, overlap_tokens: int, count: CountTokens) -> list[str]:
    if not 0 <= overlap_tokens < max_tokens:
        raise ValueError("the chunk overlap must be at least 0 and less than the chunk size")
    parts = units(text, max_tokens, count)
    chunks, first = [], 0
    while first < len(parts):
        last, total = first, parts[first].tokens
        while last + 1 < len(parts) and total + parts[last + 1].tokens <= max_tokens:
            last += 1
            total += parts[last].tokens
        chunks.append(text[parts[first].start:parts[last].end])
        if last + 1 == len(parts):
            break
        # The next chunk repeats the trailing units that fit in the overlap, and always
        # moves forward by at least one unit.
        nxt, carried = last + 1, 0
        while nxt - 1 > first and carried + parts[nxt - 1].tokens <= overlap_tokens:
            nxt -= 1
            carried += parts[nxt].tokens
        first = nxt
    return chunks
