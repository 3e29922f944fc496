"""Whisper's timestamp rules, the window split and the fallback's measures, on small
made-up vocabularies (the engine tests run them on real speech)."""

import torch

from amity.engine.transcription_fallback import Attempt, best_attempt, compression_ratio, temperature_schedule
from amity.engine.whisper_timestamps import (MAX_INITIAL_TIMESTAMP_INDEX, TimestampTokens, apply_timestamp_rules,
                                             conditioning_tokens, split_window)

# Text tokens 0..9, <|endoftext|> 10, <|notimestamps|> 11, timestamps 12.. (<|0.00|> = 12).
TOKENS = TimestampTokens(eot=10, no_timestamps=11, begin=12)
VOCAB = 12 + 100  # timestamps t(0) .. t(99)


def t(index: int) -> int:
    return TOKENS.begin + index


def allowed(output: list[int], scores: torch.Tensor | None = None) -> set[int]:
    scores = torch.zeros(1, VOCAB) if scores is None else scores[None]
    row = apply_timestamp_rules(scores, [output], TOKENS)[0]
    return {i for i in range(VOCAB) if row[i] > -float("inf")}


def test_first_token_is_an_early_timestamp():
    assert allowed([]) == {t(i) for i in range(MAX_INITIAL_TIMESTAMP_INDEX + 1)}


def test_timestamps_come_in_pairs_and_never_go_back():
    text_likelier = torch.full((VOCAB,), -10.0)
    text_likelier[:TOKENS.begin] = 0.0  # text far likelier than any timestamp
    after_text = allowed([t(0), 3, 4], text_likelier)  # text, the end, or a later timestamp
    assert after_text == set(range(11)) | {t(i) for i in range(1, 100)}  # never <|notimestamps|>
    closing = allowed([t(0), 3, 4, t(20)], text_likelier)  # a segment closed: its pair or the end
    assert closing == {10} | {t(i) for i in range(20, 100)}
    paired = allowed([t(0), 3, t(20), t(20)])  # after a pair: text or the end
    assert paired == set(range(11))
    later = allowed([t(0), 3, t(20), t(20), 5])  # the next timestamp is later than 20
    assert min(i for i in later if i >= TOKENS.begin) == t(21)


def test_timestamps_win_when_together_likelier_than_any_text():
    scores = torch.zeros(VOCAB)
    scores[0] = 3.0  # the best text token: e^3 ~ 20 against 99 allowed timestamps at e^0 each
    assert allowed([t(0), 3], scores) == {t(i) for i in range(1, 100)}
    scores[0] = 6.0  # e^6 ~ 403 > 99: text stays allowed
    assert 0 in allowed([t(0), 3], scores)


def test_split_window():
    # Ends on a lone timestamp: everything kept, the whole window done.
    segments, seek = split_window([t(0), 1, t(20), t(20), 2, t(50)], TOKENS.begin, 3000)
    assert segments == [[t(0), 1, t(20)], [t(20), 2, t(50)]] and seek == 3000
    # Ends on a pair, then text cut by the window's end: the text dropped, seek to the pair.
    segments, seek = split_window([t(0), 1, t(20), t(20), 2, t(50), t(50), 3, 4], TOKENS.begin, 3000)
    assert segments == [[t(0), 1, t(20)], [t(20), 2, t(50), t(50)]] and seek == 100
    assert conditioning_tokens(segments, TOKENS.begin) == [t(0), 1, t(20), t(20), 2, t(50)]
    # No pair at all: one segment, the whole (last, shorter) window done.
    segments, seek = split_window([t(0), 1, 2], TOKENS.begin, 1200)
    assert segments == [[t(0), 1, 2]] and seek == 1200


def test_fallback_measures():
    assert temperature_schedule(0.0) == (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    assert temperature_schedule(0.3) == (0.3, 0.4, 0.6, 0.8, 1.0)
    sentence = "Yesterday we walked to the park and watched the children play football."
    assert compression_ratio(sentence) < 2.4 < compression_ratio("Go, go, go, " * 20)
    tokens = list(range(15))
    assert Attempt(tokens, sentence, -0.3 * 15).acceptable
    unsure = Attempt(tokens, sentence, -1.5 * 15)
    repeating = Attempt(tokens * 4, "Go, go, go, " * 20, -0.1 * 60)  # sure, but repeating itself
    assert not unsure.acceptable and not repeating.acceptable
    # Every try failed: the likeliest that does not repeat itself (faster-whisper's choice).
    assert best_attempt([repeating, unsure]) is unsure
    assert best_attempt([repeating, Attempt(tokens, "Go, go, go, " * 20, -0.5 * 15)]) is repeating
