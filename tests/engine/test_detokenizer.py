"""Incremental detokenization and stop strings, on the default model's tokenizer."""

import pytest

from amity.engine.detokenizer import IncrementalDetokenizer
from amity.models.loader import default_model_path
from amity.models.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_path(default_model_path())


def stream(tokenizer, text, stop=(), prompt="Say:"):
    """Feed `text`'s tokens one at a time; return (streamed pieces, stop, final text)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode(prompt), list(stop))
    pieces, matched = [], None
    for token in ids:
        matched = detok.add([token])
        pieces.append(detok.take_new_text(finished=matched is not None))
        if matched:
            break
    else:
        pieces.append(detok.take_new_text(finished=True))
    return pieces, matched, detok.text


@pytest.mark.parametrize("text", [
    "Hello world, this is a test.",
    "Unicode: héllo wörld — 東京 🚀 naïve café",
    "  leading spaces and\nnew lines\n\n  and tabs\t.",
    "emoji cluster 👩‍👩‍👧 done",
])
def test_incremental_text_equals_full_decode(tokenizer, text):
    pieces, matched, final = stream(tokenizer, text)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert matched is None
    assert "".join(pieces) == final == tokenizer.decode(ids)
    assert all("\ufffd" not in p for p in pieces)


def test_multibyte_characters_are_never_split(tokenizer):
    text = "🚀🚀🚀"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > 3  # each emoji spans several byte tokens
    pieces, _, final = stream(tokenizer, text)
    assert final == text
    assert all(p in ("", "🚀", "🚀🚀", "🚀🚀🚀") for p in pieces)


def test_stop_string_split_over_tokens_is_cut_and_never_streamed(tokenizer):
    stop = "STOP_HERE"
    text = "Some words then STOP_HERE and more words"
    ids = tokenizer.encode(stop, add_special_tokens=False)
    assert len(ids) >= 2  # the stop string really spans tokens
    pieces, matched, final = stream(tokenizer, text, stop=[stop])
    assert matched == stop
    assert final == "Some words then "
    assert "".join(pieces) == final
    assert not any("STOP" in p or "_HERE" in p for p in pieces)


def test_held_back_prefix_is_released_when_no_stop_follows(tokenizer):
    # "ST" could begin "STOP"; it must be held, then released when the text moves on.
    pieces, matched, final = stream(tokenizer, "A ST B STO C", stop=["STOP"])
    assert matched is None
    assert "".join(pieces) == final == "A ST B STO C"


def test_earliest_of_several_stop_strings_wins(tokenizer):
    _, matched, final = stream(tokenizer, "alpha beta gamma delta", stop=["delta", "beta"])
    assert matched == "beta"
    assert final == "alpha "
