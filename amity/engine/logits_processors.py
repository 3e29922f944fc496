"""The stages of the sampling pipeline, one function each.

Two kinds live here:

* History rules (`bad_word_bans`, `no_repeat_ngram_bans`, `min_length_bans`):
  plain-Python/CPU functions of one row's token history that return the token
  ids to ban (set to -inf) at this step. They loop over a row's history or
  word list, never over the vocabulary. A row whose history the engine keeps
  across steps gets its no_repeat_ngram bans from that instead
  (`amity.engine.token_history`).
* Tensor stages (`apply_*`): in-place edits of a [B, V] float32 logits tensor.
  The penalties take flat (row, token) pairs and touch only those entries; the
  warpers take one parameter per row and are the full-vocabulary reference
  definitions (the sampler runs them on rows that need the whole vocabulary).
  For every stage the "off" value of a parameter (penalty 1, top_k 0, top_p 1,
  min_p 0, XTC inactive) is an exact no-op, so a row's result does not depend on
  whether other rows in its batch turned the stage on.
* Candidate stages (`candidates`, `truncate_candidates`, `xtc_candidates`):
  the same warpers on each row's few most likely tokens, [R, W] instead of
  [R, V]; `truncate_candidates` reports the rows whose W candidates might not
  hold every token the row keeps, so that the sampler can widen them.
* `inverse_cdf`: one categorical draw per row from one uniform per row.

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
    # Only windows whose first n-1 tokens equal the current (n-1)-suffix can be
    # completed by the next token; the suffix's own window is one token short,
    # so it never matches itself. Plain Python: converting the history to a
    # tensor alone costs as much as this scan.
    k = n - 1
    suffix = history[len(history) - k :]
    head = suffix[0]
    starts = [i for i, tok in enumerate(history[: len(history) - k]) if tok == head]
    return sorted({history[i + k] for i in starts if history[i : i + k] == suffix})


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


def apply_repetition_penalty(
    logits: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, penalty: torch.Tensor
) -> None:
    """HF: each (row, token) pair, distinct, is a token seen in that row's history;
    its logit becomes logit/p if positive, logit*p if not (`penalty` per pair)."""
    v = logits[rows, tokens]
    logits[rows, tokens] = torch.where(v < 0, v * penalty, v / penalty)


def apply_frequency_presence(
    logits: torch.Tensor,
    rows: torch.Tensor,
    tokens: torch.Tensor,
    counts: torch.Tensor,
    frequency: torch.Tensor,
    presence: torch.Tensor,
) -> None:
    """OpenAI: logit -= count * frequency + presence, for each distinct (row,
    token) pair seen `counts` > 0 times in the output (parameters per pair)."""
    logits.index_put_((rows, tokens), -(counts.to(logits.dtype) * frequency + presence), accumulate=True)


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


# --- candidate stages -------------------------------------------------------------
#
# A row's candidates are its W most likely tokens (after temperature) in the
# canonical order: logit descending, token id ascending among equal logits. The
# order is a total order on the row's tokens, so the first n candidates are the
# same whatever W the batch asked for, and every quantity below is elementwise
# or a prefix sum along that order: a row's result does not depend on W, hence
# not on the other rows of its batch. Arithmetic on candidates is float64.


def top_candidates(logits: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, V] logits -> ([R, W] logits, [R, W] token ids) of each row's
    W = min(width, V) highest logits, in canonical order. Every token outside
    has a logit <= the last candidate's."""
    if width >= logits.shape[1]:
        return logits.sort(dim=1, descending=True, stable=True)
    v, ids = logits.topk(width, dim=1, sorted=False)
    return _canonical(v, ids)


def _canonical(v: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ids, perm = ids.sort(dim=1)
    v, perm = v.gather(1, perm).sort(dim=1, descending=True, stable=True)
    return v, ids.gather(1, perm)


def scale_candidates(
    v: torch.Tensor, ids: torch.Tensor, temperature: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Canonical candidates (see `top_candidates`) -> temperature-scaled logits,
    canonical again: scaling keeps the order but can make neighbours equal."""
    if temperature is None:
        return v, ids
    return _canonical(v / temperature[:, None], ids)


def canonical_top(
    logits: torch.Tensor, n: int, cand: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's first n tokens in canonical order, exactly: ([R, n] logits,
    [R, n] ids). `cand`, canonical candidates of the same rows (W > n), spares the
    top-k; a row whose n-th logit ties with its last candidate (so tokens outside
    may tie too) is redone over the whole row."""
    vocab = logits.shape[1]
    n = min(n, vocab)
    if cand is None or cand[0].shape[1] <= min(n, vocab - 1):
        cand = top_candidates(logits, min(n + 1, vocab))
    v, ids = cand
    if v.shape[1] < vocab:
        unsure = v[:, n - 1] == v[:, -1]
        if bool(unsure.any()):
            rows = unsure.nonzero()[:, 0]
            fv, fi = top_candidates(logits[rows], vocab)
            v, ids = v[:, :n].clone(), ids[:, :n].clone()
            v[rows], ids[rows] = fv[:, :n], fi[:, :n]
    return v[:, :n], ids[:, :n]


def _mass(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """exp(v - row max) and its prefix sums, float64; a row with no finite
    logit gets zeros."""
    top = v[:, :1]
    top = torch.where(torch.isfinite(top), top, 0.0)
    e = (v - top).exp()
    return e, e.cumsum(dim=1)


def truncate_candidates(
    v: torch.Tensor,
    vocab_size: int,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
    log_norm: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """top_k, top_p, then min_p on [R, W] float64 candidates (see `candidates`),
    each with the definition of its `apply_*` reference, in place: dropped
    candidates become -inf. Parameters are per row with the same off values
    (top_k 0, top_p 1, min_p 0). `log_norm` is the logsumexp of each row's whole
    scaled vocabulary, needed (and read) only for top_p rows without top_k, whose
    candidates are not yet the whole distribution.

    Returns (v, tied, short): `tied` rows have tokens outside the candidates that
    tie with their k-th logit (so top_k keeps them): rerun with every token
    >= that logit; `short` rows might keep a token outside the candidates: rerun
    with a wider W. Both are always False when W = V."""
    rows, width = v.shape
    partial = width < vocab_size
    no = torch.zeros(rows, dtype=torch.bool, device=v.device)
    tied, short = no, no
    # Rows whose candidates are, so far, every token with probability > 0.
    complete = torch.full((rows,), not partial, dtype=torch.bool, device=v.device)
    last = v[:, -1].clone()
    if top_k is not None:
        on = top_k > 0
        kth = v.gather(1, (top_k - 1).clamp(min=0)[:, None])
        v.masked_fill_(on[:, None] & (v < kth), NEG_INF)
        if partial:
            tied = on & (last == kth[:, 0]) & torch.isfinite(last)
        complete = complete | on
    if top_p is not None:
        on = top_p < 1.0
        e, c = _mass(v)
        # The row's probability mass relative to its top logit: the candidates'
        # own total when complete, else the whole vocabulary's.
        total = c[:, -1]
        if log_norm is not None:
            top = v[:, 0]
            top = torch.where(torch.isfinite(top), top, 0.0)
            total = torch.where(complete, total, (log_norm.to(v.dtype) - top).exp())
        mass_above = torch.cat([torch.zeros_like(c[:, :1]), c[:, :-1]], dim=1)
        drop = (mass_above >= (top_p.to(v.dtype) * total)[:, None]) & on[:, None]
        drop[:, 0] = False
        if partial:
            # Exact only where the first dropped candidate's logit is above every
            # token outside: those rank after it, so the mass above them is more.
            first = (~drop).sum(dim=1).clamp(max=width - 1)
            ok = (v.gather(1, first[:, None])[:, 0] > last) & drop.any(dim=1)
            short = short | (on & ~complete & ~ok & torch.isfinite(last))
        v.masked_fill_(drop, NEG_INF)
        complete = complete | on
    if min_p is not None:
        on = min_p > 0.0
        e, _ = _mass(v)
        drop = (e < min_p.to(v.dtype)[:, None]) & on[:, None]
        if partial:
            short = short | (on & ~complete & ~drop[:, -1] & torch.isfinite(last))
        v.masked_fill_(drop, NEG_INF)
    return v, tied, short


def xtc_candidates(v: torch.Tensor, threshold: torch.Tensor, active: torch.Tensor) -> None:
    """`apply_xtc` on complete candidates (every token with probability > 0 is a
    candidate), in place. The kept candidates are a prefix in canonical order, so
    the viable ones are too; the one kept is the least likely, the lowest token
    id among equals as in `apply_xtc`'s argmin."""
    e, c = _mass(v)
    p = e / c[:, -1:]
    thr = threshold.to(v.dtype)[:, None]
    viable = (p >= thr) & active[:, None] & (thr > 0)
    n = viable.sum(dim=1, keepdim=True)
    least = v.gather(1, (n - 1).clamp(min=0))
    keep = (v > least).sum(dim=1, keepdim=True)  # first candidate equal to `least`
    pos = torch.arange(v.shape[1], device=v.device)[None, :]
    v.masked_fill_((pos < n) & (pos != keep) & (n >= 2), NEG_INF)


def inverse_cdf(v: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One categorical draw per row of softmax(v) ([R, W] logits, -inf = removed)
    from one uniform u in [0, 1) per row (float64): the first position whose
    cumulative probability exceeds u. Returns [R] positions into v's columns.

    The cumulative sum is float64 (over the float64 u) and unnormalized, u scaled
    by the row's own total: u * total < total, so the position found has p > 0;
    a guard maps any rounding accident there to the last position with p > 0."""
    width = v.shape[1]
    top = v.amax(dim=1, keepdim=True)
    e = (v - torch.where(torch.isfinite(top), top, 0.0)).exp()
    c = e.cumsum(dim=1, dtype=torch.float64)
    total = c[:, -1:]
    idx = torch.searchsorted(c, u.to(torch.float64)[:, None] * total, right=True).clamp_(max=width - 1)
    zero = e.gather(1, idx) == 0
    if bool(zero.any()):
        idx = torch.where(zero, torch.searchsorted(c, total).clamp_(max=width - 1), idx)
    return idx[:, 0]
