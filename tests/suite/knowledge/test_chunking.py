"""The chunker, counting with the real all-MiniLM-L6-v2 tokenizer (as the embedding
container's /v1/tokenize does): chunk sizes, overlap, coverage, long sentences and
long words."""

import re

import pytest

from amity.suite.knowledge.chunking import chunk

MAX_TOKENS, OVERLAP_TOKENS = 40, 16  # a sentence here is about 13 tokens


@pytest.fixture(scope="module")
def count(minilm_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    return lambda texts: [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]


SENTENCES = [f"Sentence number {i} talks about topic {i * 7 % 13} and nothing else." for i in range(60)]
TEXT = "\n\n".join(" ".join(SENTENCES[i:i + 4]) for i in range(0, 60, 4))


def test_chunks_fit_cover_the_text_and_overlap(count):
    chunks = chunk(TEXT, MAX_TOKENS, OVERLAP_TOKENS, count)
    assert len(chunks) > 5
    assert all(n <= MAX_TOKENS for n in count(chunks)), count(chunks)
    assert all(c in TEXT for c in chunks)  # the document's own text, line breaks kept
    # Every sentence is in some chunk, in order; consecutive chunks share a sentence.
    for sentence in SENTENCES:
        assert any(sentence in c for c in chunks), sentence
    for before, after in zip(chunks, chunks[1:]):
        first_sentence = re.match(r".*?\.(?=\s|$)", after).group(0)
        assert first_sentence in before
        assert count([first_sentence])[0] <= OVERLAP_TOKENS
    # And the overlap is only that: each chunk starts later than the one before it.
    starts = [TEXT.index(c) for c in chunks]
    assert starts == sorted(set(starts))


def test_without_overlap_the_chunks_partition_the_sentences(count):
    chunks = chunk(TEXT, MAX_TOKENS, 0, count)
    assert sum(c.count("Sentence number") for c in chunks) == len(SENTENCES)


def test_a_long_sentence_and_a_long_word_are_cut(count):
    long_sentence = " ".join(f"word{i}" for i in range(200)) + "."
    long_word = "x" * 3000
    text = f"Short start. {long_sentence} {long_word} Short end."
    chunks = chunk(text, MAX_TOKENS, OVERLAP_TOKENS, count)
    assert all(n <= MAX_TOKENS for n in count(chunks))
    assert "".join(chunks).count("x") >= 3000  # nothing of the word is lost
    for i in range(200):
        assert any(re.search(rf"\bword{i}\b", c) for c in chunks), i
    words = set(text.split())
    for c in chunks:  # the sentence is cut between words, not inside one
        assert all(w in words or set(w) == {"x"} for w in c.split()), c


def test_the_overlap_must_be_smaller_than_a_chunk(count):
    with pytest.raises(ValueError):
        chunk(TEXT, 10, 10, count)
