"""The stages of the sampling pipeline, one function each.

Two kinds live here:

* History rules (`bad_word_bans`, `no_repeat_ngram_bans`, `min_length_bans`):
  plain-Python/CPU functions of one row's token history that return the token
  ids to ban (set to -inf) at this step. They loop over a row's history or
  word list, never over the vocabulary.
* Tensor stages (`apply_*`): in-place edits of a [B, V] float32 logits tensor
  with one parameter per row. For every stage the "off" value of a parameter
  (penalty 1, top_k 0, top_p 1, min_p 0, XTC inactive) is an exact no-op, so a
  row's result does not depend on whether other rows in its batch turned the
  stage on.

`amity.engine.sampler` decides the order and which stages run; see its module
docstring.
"""

import torch

NEG_INF = float("-inf")


# --- history rules ------------------------------------------------------------


def suffix_completions(history: list[int], sequences: list[list[int]]) -> list[int]:
    """The last token of every sequence whose first N-1 tokens end `history`.

    A one-token sequence always matches (its prefix is empty)."""
    out = []
    n_hist = len(history)
    for seq in sequences:
        k = len(seq) - 1
        if k == 0 or (k <= n_hist and history[n_hist - k :] == seq[:-1]):
            out.append(seq[-1])
    return out


def bad_word_bans(history: list[int], bad_words: list[list[int]]) -> list[int]:
    """HF `bad_words_ids`: ban a phrase's last token when the history ends with
    the rest of it. Unlike HF, a one-token bad word equal to EOS is still banned:
    the spec says bad words are never generated and makes no EOS exception."""
    return suffix_completions(history, bad_words)


def no_repeat_ngram_bans(history: list[int], n: int) -> list[int]:
    """HF `no_repeat_ngram_size`: ban every token that would complete an n-gram
    already present in `history`."""
    if n <= 1 or len(history) < n:
        return []
    ids = torch.tensor(history, dtype=torch.long)
    # Only windows whose first n-1 tokens equal the current (n-1)-suffix can be
    # completed by the next token; the suffix's own window is one token short,
    # so it never matches itself.
    windows = ids.unfold(0, n, 1)
    prefix = ids[len(history) - n + 1 :]
    matches = (windows[:, :-1] == prefix).all(dim=1)
    return windows[matches, -1].unique().tolist()


def min_length_bans(
    num_prompt: int,
    num_output: int,
    history: list[int],
    min_tokens: int,
    min_total_tokens: int | None,
    eos_token_ids: frozenset[int],
    stop_tokens: list[list[int]],
) -> list[int]:
    """Until `min_tokens` new tokens (or `min_total_tokens` in all) exist, ban
    whatever would end the sequence: every EOS id and the last token of each
    stop sequence the history is about to complete.

    Stop prefixes are matched against prompt + output, a superset of what a stop
    checker that looks at output only would fire on, so the minimum holds under
    either reading."""
    short = num_output < min_tokens or (
        min_total_tokens is not None and num_prompt + num_output < min_total_tokens
    )
    if not short:
        return []
    return list(eos_token_ids) + suffix_completions(history, stop_tokens)


# --- tensor stages --------------------------------------------------------------


def token_presence(ids: torch.Tensor, vocab_size: int, counts: bool) -> torch.Tensor:
    """[R, L] token ids padded with any id >= vocab_size -> [R, V] counts (or a
    bool mask). Ids outside the logits' vocab land in a spare column, dropped."""
    ids = ids.clamp(max=vocab_size)
    if counts:
        out = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.float32, device=ids.device)
        out.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    else:
        out = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.bool, device=ids.device)
        out.scatter_(1, ids, True)
    return out[:, :vocab_size]


def apply_repetition_penalty(logits: torch.Tensor, ids: torch.Tensor, penalty: torch.Tensor) -> None:
    """HF: each token seen in `ids` gets logit/p if positive, logit*p if not."""
    seen = token_presence(ids, logits.shape[1], counts=False)
    p = penalty[:, None]
    penalized = torch.where(logits < 0, logits * p, logits / p)
    logits.copy_(torch.where(seen, penalized, logits))


def apply_frequency_presence(
    logits: torch.Tensor, ids: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor
) -> None:
    """OpenAI: logit -= count * frequency + (count > 0) * presence."""
    counts = token_presence(ids, logits.shape[1], counts=True)
    logits -= counts * frequency[:, None] + (counts > 0).float() * presence[:, None]


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> None:
    logits /= temperature[:, None]


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> None:
    """Keep each row's k highest logits (ties with the k-th are kept, as in HF).
    k <= 0 or k >= V is off."""
    vocab = logits.shape[1]
    on = (top_k > 0) & (top_k < vocab)
    if not bool(on.any()):
        return
    k = torch.where(on, top_k, 1)
    kth = logits.topk(int(k.max()), dim=1).values.gather(1, (k - 1)[:, None])
    kth = torch.where(on[:, None], kth, NEG_INF)
    logits.masked_fill_(logits < kth, NEG_INF)


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> None:
    """Keep the smallest most-likely-first set whose probability reaches top_p:
    a token stays iff the tokens ranked above it sum to less than top_p. The top
    token always stays. top_p >= 1 is off."""
    probs, order = logits.softmax(dim=1).sort(dim=1, descending=True)
    mass_above = probs.cumsum(dim=1) - probs
    # Off rows compare against 2, which no probability mass reaches; rounding in
    # the cumsum could otherwise reach 1.0 and drop the tail.
    p = torch.where(top_p < 1.0, top_p, 2.0)[:, None]
    drop_sorted = mass_above >= p
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
    logits.masked_fill_(drop, NEG_INF)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> None:
    """Drop tokens whose probability is below min_p times the top probability."""
    probs = logits.softmax(dim=1)
    floor = min_p[:, None] * probs.amax(dim=1, keepdim=True)
    logits.masked_fill_(probs < floor, NEG_INF)


def apply_xtc(logits: torch.Tensor, threshold: torch.Tensor, active: torch.Tensor) -> None:
    """Exclude Top Choices: in `active` rows, of the tokens whose probability (of
    the distribution as truncated so far) is >= threshold, remove all but the
    least likely one; nothing happens with fewer than two such tokens."""
    probs = logits.softmax(dim=1)
    viable = (probs >= threshold[:, None]) & active[:, None] & (threshold[:, None] > 0)
    keep = torch.where(viable, probs, float("inf")).argmin(dim=1, keepdim=True)
    remove = viable.scatter(1, keep, False) & (viable.sum(dim=1, keepdim=True) >= 2)
    logits.masked_fill_(remove, NEG_INF)


def exponential_race(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """One categorical draw per row from its own generator: argmax(p / q) with
    q ~ Exp(1) i.i.d. picks token i with probability p_i (the race of exponential
    clocks with rates p_i). Each row draws exactly V numbers from its generator,
    so its result depends on its own seed and state only."""
    vocab = probs.shape[1]
    q = torch.stack(
        [torch.empty(vocab, device=g.device).exponential_(generator=g).to(probs.device) for g in generators]
    )
    # Exp(1) can come out as exactly 0; a tiny floor keeps p / q from 0 / 0 = NaN
    # on removed tokens (p = 0), which argmax would pick.
    q.clamp_(min=torch.finfo(torch.float32).tiny)
    return (probs / q).argmax(dim=1)
