"""Incremental detokenization and stop strings.

Decoding token by token breaks multi-byte characters and drops the spaces some
tokenizers attach to the next token, so each step decodes a short window (the
last few tokens already turned into text, plus the new ones) and keeps only the
text beyond the window's old part; a window that ends in an incomplete UTF-8
sequence (U+FFFD) waits for the next token.

Stop strings may arrive split over tokens. The text is searched where a match
could newly end, and while a stop string could still be forming, its possible
start is held back from the stream, so no part of a stop string is ever emitted.
Before `min_tokens` output tokens no stop may fire, so the text of the first
`min_tokens` tokens is never searched (vLLM's moving stop-check offset): a stop
must end in text that came after them, and the text always equals the tokens.
"""

from amity.models.tokenizer import Tokenizer

_CONTEXT_TOKENS = 5  # prompt tokens that seed the window, for the first token's spacing


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int], stop: list[str],
                 skip_special_tokens: bool = True, min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.stop = [s for s in stop if s]
        self.max_stop_len = max((len(s) for s in self.stop), default=0)
        self.text = ""
        self.num_emitted_chars = 0
        self.min_tokens = min_tokens
        self.num_output_tokens = 0
        self.stop_search_start = 0  # a stop must end beyond this index of `text`

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: list[int]) -> str | None:
        """Add tokens; returns the stop string they completed, if any (the text
        is then cut just before it)."""
        self.ids.extend(token_ids)
        self.num_output_tokens += len(token_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        full_text = self._decode(self.ids[self.prefix_offset:])
        if len(full_text) <= len(prefix_text) or full_text.endswith("\ufffd"):
            return None
        new_text = full_text[len(prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        searched = len(self.text)  # text before this was searched on an earlier call
        self.text += new_text
        if self.num_output_tokens <= self.min_tokens:
            self.stop_search_start = len(self.text)
        if not self.stop:
            return None
        boundary = max(searched, self.stop_search_start)
        matches = [(i, s) for s in self.stop
                   if (i := self.text.find(s, max(0, boundary - len(s) + 1))) != -1]
        if not matches:
            return None
        index, stop = min(matches)
        self.text = self.text[:index]
        return stop

    def take_new_text(self, finished: bool) -> str:
        """Text not yet handed out, minus any tail that could begin a stop string."""
        end = len(self.text)
        if not finished:
            for k in range(min(self.max_stop_len - 1, end - self.num_emitted_chars), 0, -1):
                tail = self.text[end - k:]
                if any(s.startswith(tail) for s in self.stop):
                    end -= k
                    break
        new = self.text[self.num_emitted_chars:end]
        self.num_emitted_chars = end
        return new
