"""One request's token history in the forms the sampler's history-wide stages
read, kept up to date step by step instead of rebuilt from the whole history at
every step (vLLM v1 keeps its rows' token ids across steps in the same spirit):

* the distinct token ids of prompt + output (repetition_penalty),
* the distinct token ids of the output and how often each occurs (frequency and
  presence penalties),
* for `no_repeat_ngram` n > 1, every n-gram seen, as its first n-1 tokens -> the
  tokens that completed them.

A history mirrors a request's `all_token_ids`, which only ever grows: `extend`
reads only the tokens appended since its last call, so a decode step costs a few
numpy operations over the distinct tokens instead of a Python pass over the whole
history. The persistent input batch keeps one per row whose parameters read it and
drops it when the row changes hands (input_batch.py); the sampler builds a throwaway one for a row that
brings none (scoring, tests), so both count through the same code. A throwaway
one indexes no n-grams: for one step, one scan of the history is cheaper.
"""

import numpy as np

from amity.engine import logits_processors as lp
from amity.engine.sampling_params import SamplingParams

_NONE = np.empty(0, dtype=np.int64)


def uses_history(params: SamplingParams) -> bool:
    """Whether the sampler reads a `TokenHistory` for rows with these parameters."""
    return uses_counts(params) or params.no_repeat_ngram > 1


def uses_counts(params: SamplingParams) -> bool:
    return params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0


def _find(ids: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ascending distinct `keys` is, or would be inserted, in
    ascending distinct `ids`; and whether it is there."""
    at = np.searchsorted(ids, keys)
    found = at < len(ids)
    found[found] = ids[at[found]] == keys[found]
    return at, found


def _add_distinct(ids: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Ascending distinct `ids` and more tokens -> the same, with those among them."""
    keys = np.unique(new)
    at, found = _find(ids, keys)
    return np.insert(ids, at[~found], keys[~found])


def _count_into(ids: np.ndarray, counts: np.ndarray, new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ascending distinct `ids` with their `counts`, and more tokens -> the same
    with those counted too. New arrays: ones handed out earlier stay as they were."""
    keys, n = np.unique(new, return_counts=True)
    at, found = _find(ids, keys)
    counts = counts.copy()
    counts[at[found]] += n[found]
    missing = ~found
    return np.insert(ids, at[missing], keys[missing]), np.insert(counts, at[missing], n[missing])


class TokenHistory:
    def __init__(self, params: SamplingParams, index_ngrams: bool = True):
        self.counted = uses_counts(params)
        self.ngram = params.no_repeat_ngram
        self.indexed = index_ngrams and self.ngram > 1
        self.num_tokens = 0  # how much of the history is taken in
        self.seen = _NONE  # distinct ids of prompt + output, ascending
        self.output_ids = _NONE  # distinct ids of the output, ascending
        self.output_counts = _NONE  # how often each occurs
        # n-gram head -> the tokens that followed it. Tuples, not sets: tuples of
        # ints leave the garbage collector's care, thousands of sets would not.
        self._ngrams: dict[tuple[int, ...], tuple[int, ...]] = {}

    def extend(self, token_ids: list[int], num_prompt_tokens: int) -> None:
        """Take in the tokens of `token_ids` (the whole history, of which the ones
        taken in before are a prefix) appended since the last call."""
        start = self.num_tokens
        if len(token_ids) < start:
            raise ValueError(f"a history of {len(token_ids)} tokens after one of {start}: histories only grow")
        if len(token_ids) == start:
            return
        if self.counted:
            new = np.array(token_ids[start:], dtype=np.int64)
            self.seen = _add_distinct(self.seen, new)
            output = new[max(num_prompt_tokens - start, 0):]
            if len(output):
                self.output_ids, self.output_counts = _count_into(self.output_ids, self.output_counts, output)
        if self.indexed:
            # Each new token with the k tokens before it, as (k-tuple, token) pairs.
            k, first, end = self.ngram - 1, max(start, self.ngram - 1), len(token_ids)
            windows = zip(*(token_ids[first - k + j:end - k + j] for j in range(k)))
            for window, token in zip(windows, token_ids[first:]):
                following = self._ngrams.get(window, ())
                if token not in following:
                    self._ngrams[window] = following + (token,)
        self.num_tokens = len(token_ids)

    def ngram_bans(self, token_ids: list[int]) -> list[int]:
        """HF `no_repeat_ngram_size`: every token that would complete an n-gram
        already in the history (`token_ids`, the one taken in), ascending."""
        if not self.indexed:
            return lp.no_repeat_ngram_bans(token_ids, self.ngram)
        return sorted(self._ngrams.get(tuple(token_ids[len(token_ids) - self.ngram + 1:]), ()))
