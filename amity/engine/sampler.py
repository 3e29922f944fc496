"""The batched sampler: one next token (and optionally its logprobs) per row.

Pipeline, in this fixed order, over the [B, V] logits in float32 (a copy where
stages 1-5 edit them, unless the caller hands them over with `editable=True`;
nothing after stage 5 writes to them). Each
stage is skipped as a whole when no row in the batch uses it; a row that does
not use a stage is left bit-for-bit unchanged by it.

 1. logit_bias          add each row's {token: bias}.
 2. bad_word_tokens     HF `bad_words_ids` over prompt + output: a one-token word
                        is always banned; an N-token phrase bans its last token
                        when prompt + output ends with its first N-1.
 3. no_repeat_ngram     HF `no_repeat_ngram_size` over prompt + output.
 4. min_tokens /        while output < min_tokens (or prompt + output <
    min_total_tokens    min_total_tokens): ban the EOS ids and the last token of
                        each stop_tokens sequence whose prefix ends prompt +
                        output (a one-token stop sequence is always banned).
                        Stages 2-4 only ever set -inf, so they are gathered into
                        one index list and applied as one scatter.
 5. repetition_penalty  HF, over prompt + output; then frequency_penalty and
                        presence_penalty, OpenAI, over output only.
 6. logprobs            REPORTED LOGPROBS ARE log_softmax OF THE LOGITS HERE:
                        after the request's bias, bans and penalties, before
                        temperature and truncation. `score` reports the same.
 7. temperature         temperature 0 rows (any below GREEDY_TEMPERATURE_EPS) are
                        greedy: their token is the argmax of the stage-5 logits
                        and stages 7-9 skip them.
 8. top_k, top_p, min_p, then XTC, each on the distribution left by the ones
                        before it (renormalized). XTC fires with probability
                        xtc_probability per step: one uniform from the row's
                        generator, drawn only when xtc_probability > 0 and
                        xtc_threshold > 0, before the sampling draw.
                        Rows that truncate run these on their candidates: their
                        most likely tokens (k + 1 of them with top_k, else
                        PROBE_WIDTH), in a canonical order (logit descending,
                        token id ascending among equals); a row whose candidates
                        might miss a kept token (a tie with the k-th logit, or a
                        top_p / min_p set reaching the last candidate) is redone
                        wider, up to the whole vocabulary, so the result is
                        exact (see `logits_processors.truncate_candidates`).
                        Rows that truncate nothing use the whole vocabulary.
 9. sample              greedy rows: argmax; random rows: inverse-CDF sampling,
                        one float64 uniform per row from the row's own generator
                        (see `logits_processors.inverse_cdf`), so a row's draw
                        depends only on its seed and state.

Everything history-derived (bans, penalty (row, token) pairs) is computed on
the CPU by `SamplingTensors.build`, then shipped to the logits' device once;
stages 1-5 edit only those entries of the batch tensor. What reads the whole
history (no_repeat_ngram, the penalties' token sets and counts) comes from each
row's `TokenHistory` (token_history.py), which the engine keeps across steps with
the request's input-batch row, so a decode step takes in only its new token.
Token ids outside [0, V) in histories, bans or biases are ignored.
"""

from dataclasses import dataclass

import numpy as np
import torch

from amity.engine import logits_processors as lp
from amity.engine.outputs import TokenLogprob
from amity.engine.sampling_params import SamplingParams
from amity.engine.token_history import TokenHistory, uses_history
from amity.models.cpu_kernels import load_cpu_kernels


@dataclass
class SamplingRow:
    """One sequence to sample for, as plain Python state."""

    params: SamplingParams
    token_ids: list[int]  # the history: prompt, then output (read, never copied)
    num_prompt_tokens: int
    generator: torch.Generator | None  # the request's own generator; None when greedy
    eos_token_ids: frozenset[int]  # already resolved (params.eos_token or the model's)
    # The request's history kept across steps (the input batch's), brought up to
    # date from token_ids here; None: one is built from token_ids for this call.
    history: TokenHistory | None = None


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[TokenLogprob | None]  # per row; None when params.logprobs is None


def _rows(idx: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(idx, dtype=torch.long, device=device)


def _floats(vals: list[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(vals, dtype=torch.float32, device=device)


def _in_vocab(ascending_ids: np.ndarray, vocab_size: int) -> slice:
    """The part of ascending token ids that lies in [0, vocab_size)."""
    return slice(np.searchsorted(ascending_ids, 0), np.searchsorted(ascending_ids, vocab_size))


def _pairs(pieces: list[tuple[np.ndarray, ...]], device: torch.device) -> tuple[torch.Tensor, ...] | None:
    """Per-row (row, token, values...) arrays -> flat tensors on `device`, rows
    in batch order and tokens ascending within each; None when no row uses them."""
    if not pieces:
        return None
    return tuple(torch.from_numpy(np.concatenate(column)).to(device) for column in zip(*pieces))


# Candidates first taken for a top_p / min_p row without top_k, and the factor a
# row's width grows by when its candidates turn out too few (see `_sample_truncated`).
PROBE_WIDTH = 128
WIDEN = 16


@dataclass
class SamplingTensors:
    """A batch's parameters as device tensors; None marks a stage to skip."""

    # Stage 1: flat (row, token, bias).
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    # Stages 2-4: flat (row, token) to set to -inf.
    bans: tuple[torch.Tensor, torch.Tensor] | None
    # Stage 5: distinct (row, token) pairs of prompt + output, penalty per pair.
    repetition: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    # Stage 5: distinct (row, token) pairs of the output, count, frequency and presence per pair.
    frequency: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None
    # Stage 6: top-N per row, None for no logprobs.
    num_logprobs: list[int | None]
    # Stages 7-9 cover the random rows only; values below are per random row.
    random_rows: list[int]
    generators: list[torch.Generator | None]  # checked by the sampler, not needed to score
    temperature: torch.Tensor | None
    top_k: torch.Tensor | None  # 0 where off (k <= 0 or k >= V)
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    # XTC: (threshold, probability) for random rows; probability 0 = never.
    xtc: tuple[torch.Tensor, list[float]] | None
    # Per random row: whether it truncates (top_k, top_p or min_p), and the
    # candidate width it starts with.
    truncated: list[bool]
    widths: list[int]

    @classmethod
    def build(cls, rows: list[SamplingRow], vocab_size: int, device: torch.device) -> "SamplingTensors":
        def valid(t: int) -> bool:
            return 0 <= t < vocab_size

        bias_r, bias_t, bias_v = [], [], []
        ban_r, ban_t = [], []
        # Stage 5 per row that uses it: numpy (row, token, per-pair values) pieces.
        rep: list[tuple[np.ndarray, ...]] = []
        freq: list[tuple[np.ndarray, ...]] = []
        for i, row in enumerate(rows):
            p = row.params
            history = row.token_ids
            tracked = None
            if uses_history(p):
                tracked = row.history if row.history is not None else TokenHistory(p, index_ngrams=False)
                tracked.extend(history, row.num_prompt_tokens)
            for tok, b in (p.logit_bias or {}).items():
                if valid(int(tok)):
                    bias_r.append(i)
                    bias_t.append(int(tok))
                    bias_v.append(float(b))
            banned = lp.bad_word_bans(history, p.bad_word_tokens)
            if tracked is not None:
                banned += tracked.ngram_bans(history)
            banned += lp.min_length_bans(
                row.num_prompt_tokens,
                len(history) - row.num_prompt_tokens,
                history,
                p.min_tokens,
                p.min_total_tokens,
                row.eos_token_ids,
                p.stop_tokens,
            )
            for tok in set(banned):
                if valid(tok):
                    ban_r.append(i)
                    ban_t.append(tok)
            if p.repetition_penalty != 1.0:
                tok = tracked.seen[_in_vocab(tracked.seen, vocab_size)]
                rep.append((np.full(len(tok), i), tok, np.full(len(tok), p.repetition_penalty, np.float32)))
            if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
                at = _in_vocab(tracked.output_ids, vocab_size)
                tok, n = tracked.output_ids[at], tracked.output_counts[at]
                freq.append((np.full(len(tok), i), tok, n, np.full(len(tok), p.frequency_penalty, np.float32),
                             np.full(len(tok), p.presence_penalty, np.float32)))

        random_rows = [i for i, r in enumerate(rows) if not r.params.is_greedy]
        rp = [rows[i].params for i in random_rows]

        def per_random(values: list, used: bool, dtype=torch.float32) -> torch.Tensor | None:
            return torch.tensor(values, dtype=dtype, device=device) if used else None

        top_k = [q.top_k if 0 < q.top_k < vocab_size else 0 for q in rp]
        truncated = [k > 0 or q.top_p < 1.0 or q.min_p > 0.0 for k, q in zip(top_k, rp)]
        xtc_on = [q.xtc_probability > 0 and q.xtc_threshold > 0 for q in rp]
        xtc_threshold = [q.xtc_threshold if on else 0.0 for q, on in zip(rp, xtc_on)]
        xtc_chance = [q.xtc_probability if on else 0.0 for q, on in zip(rp, xtc_on)]
        return cls(
            bias=(_rows(bias_r, device), _rows(bias_t, device), _floats(bias_v, device)) if bias_r else None,
            bans=(_rows(ban_r, device), _rows(ban_t, device)) if ban_r else None,
            repetition=_pairs(rep, device),
            frequency=_pairs(freq, device),
            num_logprobs=[r.params.logprobs for r in rows],
            random_rows=random_rows,
            generators=[rows[i].generator for i in random_rows],
            temperature=per_random([q.temperature for q in rp], any(q.temperature != 1.0 for q in rp)),
            top_k=per_random(top_k, any(top_k), torch.long),
            top_p=per_random([q.top_p for q in rp], any(q.top_p < 1.0 for q in rp)),
            min_p=per_random([q.min_p for q in rp], any(q.min_p > 0.0 for q in rp)),
            xtc=(_floats(xtc_threshold, device), xtc_chance) if any(xtc_on) else None,
            truncated=truncated,
            # A top_k row takes one candidate more than k, to see whether the k-th ties.
            widths=[min(k + 1 if k else PROBE_WIDTH, vocab_size) for k in top_k],
        )


def _process(logits: torch.Tensor, t: SamplingTensors, editable: bool = False) -> torch.Tensor:
    """Stages 1-5 on a float32 copy (the float32 logits themselves where no stage
    edits them, or where they are `editable`): the distribution logprobs report."""
    edits = t.bias is not None or t.bans is not None or t.repetition is not None or t.frequency is not None
    x = logits.to(torch.float32, copy=edits and not editable)
    # The engine's logits come out of inference mode, and only there may they be edited.
    with torch.inference_mode(x.is_inference()):
        if t.bias is not None:
            r, tok, v = t.bias
            x.index_put_((r, tok), v, accumulate=True)
        if t.bans is not None:
            x[t.bans] = lp.NEG_INF
        if t.repetition is not None:
            lp.apply_repetition_penalty(x, *t.repetition)
        if t.frequency is not None:
            lp.apply_frequency_presence(x, *t.frequency)
    return x


def _top_logprobs(
    x: torch.Tensor,
    chosen: list[int],
    num: list[int | None],
    cand: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> list[TokenLogprob | None]:
    """Stage 6 from the stage-5 logits `x`: log_softmax, as logit - logsumexp, of
    the rows that want it; the top-N in canonical order (logprob descending, token
    id ascending among equals), so sampling and `score` agree exactly. `cand`:
    canonical candidates of the rows with N > 0 (see `lp.top_candidates`), if any."""
    want = [i for i, n in enumerate(num) if n is not None]
    out: list[TokenLogprob | None] = [None] * len(num)
    if not want:
        return out
    idx = _rows(want, x.device)
    sub = x if len(want) == x.shape[0] else x[idx]
    lse = sub.logsumexp(dim=1, keepdim=True)
    chosen_lp = (sub.gather(1, _rows([chosen[i] for i in want], x.device)[:, None]) - lse)[:, 0].tolist()
    tops = [j for j, i in enumerate(want) if num[i]]
    top: dict[int, list[tuple[int, float]]] = {}
    if tops:
        pos = _rows(tops, x.device)
        some = len(tops) == len(want)
        v, ids = lp.canonical_top(sub if some else sub[pos], max(num[want[j]] for j in tops), cand)
        v = (v - (lse if some else lse[pos])).tolist()
        for j, vs, ts in zip(tops, v, ids.tolist()):
            n = num[want[j]]
            top[j] = list(zip(ts[:n], vs[:n]))
    for j, i in enumerate(want):
        out[i] = TokenLogprob(chosen[i], chosen_lp[j], top.get(j, []))
    return out


def _pick(t: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t[idx]


def _draws(t: SamplingTensors, device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Each random row's draws from its own generator, in this order: the XTC
    uniform (float32; only when its XTC is on), then the sampling uniform
    (float64). Returns (XTC fires, per random row, or None; sampling uniforms)."""
    chance = t.xtc[1] if t.xtc is not None else [0.0] * len(t.generators)
    xtc_u, sample_u = [], []
    for g, c in zip(t.generators, chance):
        if c > 0:
            xtc_u.append(torch.rand(1, generator=g, device=g.device).to(device))
        else:
            xtc_u.append(torch.ones(1, device=device))
        sample_u.append(torch.rand(1, generator=g, device=g.device, dtype=torch.float64).to(device))
    fire = torch.cat(xtc_u) < _floats(chance, device) if t.xtc is not None else None
    return fire, torch.cat(sample_u)


def _sample_plain(x: torch.Tensor, t: SamplingTensors, j: torch.Tensor, fire, u: torch.Tensor) -> torch.Tensor:
    """Random rows that truncate nothing, [R, V] stage-5 logits: temperature,
    XTC over the whole vocabulary, the draw; returns token ids."""
    temperature = _pick(t.temperature, j)
    xtc = t.xtc is not None and bool(fire.any())
    if temperature is not None:
        x = x / temperature[:, None]
    elif xtc:
        x = x.clone()  # the caller's logits still serve stage 6
    if xtc:
        lp.apply_xtc(x, t.xtc[0][j], fire)
    return lp.inverse_cdf(x, u)


def _sample_truncated(
    x: torch.Tensor,
    t: SamplingTensors,
    j: torch.Tensor,
    fire,
    u: torch.Tensor,
    cand: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """Random rows that truncate, [R, V] stage-5 logits (row r is random row
    j[r]) and their canonical candidates, at least each row's width wide: stages
    7-9 on the candidates, widened until exact; returns token ids."""
    vocab = x.shape[1]
    temperature, top_k = _pick(t.temperature, j), _pick(t.top_k, j)
    top_p, min_p = _pick(t.top_p, j), _pick(t.min_p, j)
    threshold = _pick(t.xtc[0], j) if t.xtc is not None else None
    log_norm = None
    if top_p is not None:
        # top_p without top_k reads the whole vocabulary's mass.
        need = (top_p < 1.0) & (top_k == 0) if top_k is not None else top_p < 1.0
        if bool(need.any()):
            rows = need.nonzero()[:, 0]
            scaled = x[rows] / temperature[rows, None] if temperature is not None else x[rows]
            log_norm = torch.zeros(len(j), dtype=torch.float32, device=x.device)
            log_norm[rows] = scaled.logsumexp(dim=1)

    tokens = torch.empty(len(j), dtype=torch.long, device=x.device)
    todo = torch.arange(len(j), device=x.device)
    width = cand[0].shape[1]
    while True:
        whole = len(todo) == len(j)
        sub = lambda s: s if s is None or whole else s[todo]  # noqa: E731
        xs, temp, k = x if whole else x[todo], sub(temperature), sub(top_k)
        if cand is None:
            cand = lp.top_candidates(xs, width)
        v, ids = lp.scale_candidates(*cand, temp)
        cand = None
        v = v.to(torch.float64)
        kth = v.gather(1, (k - 1).clamp(min=0)[:, None]) if k is not None else None
        v, tied, short = lp.truncate_candidates(v, vocab, k, sub(top_p), sub(min_p), sub(log_norm))
        if threshold is not None:
            lp.xtc_candidates(v, sub(threshold), sub(fire))
        tokens[todo] = ids.gather(1, lp.inverse_cdf(v, sub(u))[:, None])[:, 0]
        redo = tied | short
        if not bool(redo.any()):
            return tokens
        # Widen the rows that were not exact: to every token tied with the k-th
        # (and one below it), or by WIDEN for a top_p / min_p row without top_k.
        widths = [0]
        if bool(short.any()):
            widths.append(width * WIDEN)
        if bool(tied.any()):
            tie_rows = tied.nonzero()[:, 0]
            scaled = xs[tie_rows] / temp[tie_rows, None] if temp is not None else xs[tie_rows]
            reach = (scaled >= kth[tie_rows].to(scaled.dtype)).sum(dim=1)
            widths.append(int(reach.max()) + 1)
        width = min(max(widths), vocab)
        todo = todo[redo]


def _argmax(x: torch.Tensor) -> torch.Tensor:
    """Each row's greedy token, as torch.argmax(x, dim=1) gives it; on the CPU through
    our kernel (csrc/argmax.cpp), several times faster."""
    if x.device.type != "cpu":
        return x.argmax(dim=1)
    load_cpu_kernels()
    return torch.ops.amity.argmax_rows(x)


class Sampler:
    def processed_logits(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """Stages 1-5: the float32 logits whose log_softmax logprobs report."""
        return _process(logits, SamplingTensors.build(rows, logits.shape[1], logits.device))

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow], editable: bool = False) -> SamplerOutput:
        """`editable`: stages 1-5 may write to float32 `logits` in place (at 32 rows of
        the default model's vocabulary, a copy is 6 MB a step)."""
        if not rows:
            return SamplerOutput([], [])
        t = SamplingTensors.build(rows, logits.shape[1], logits.device)
        x = _process(logits, t, editable)
        device = x.device

        tokens = torch.empty(len(rows), dtype=torch.long, device=device)
        greedy = [i for i, r in enumerate(rows) if r.params.is_greedy]
        if len(greedy) == len(rows):
            tokens = _argmax(x)
        elif greedy:
            g = _rows(greedy, device)
            tokens[g] = _argmax(x[g])

        # One top-k serves the truncating rows' candidates and the top logprobs.
        need: dict[int, int] = {}
        for jj, i in enumerate(t.random_rows):
            if t.truncated[jj]:
                need[i] = t.widths[jj]
        for i, n in enumerate(t.num_logprobs):
            if n:
                need[i] = min(max(need.get(i, 0), n + 1), x.shape[1])
        cand_rows = sorted(need)
        cand = None
        if cand_rows:
            xc = x if len(cand_rows) == len(rows) else x[_rows(cand_rows, device)]
            cand = lp.top_candidates(xc, max(need.values()))
        cand_pos = {i: p for p, i in enumerate(cand_rows)}

        def cand_of(batch_rows: list[int]):
            if not batch_rows or cand is None:
                return None
            if batch_rows == cand_rows:
                return cand
            pos = _rows([cand_pos[i] for i in batch_rows], device)
            return cand[0][pos], cand[1][pos]

        if t.random_rows:
            missing = [i for i, g in zip(t.random_rows, t.generators) if g is None]
            if missing:
                raise ValueError(f"rows {missing} sample (temperature > 0) but have no generator")
            fire, u = _draws(t, device)
            for truncated in (False, True):
                js = [j for j, tr in enumerate(t.truncated) if tr == truncated]
                if not js:
                    continue
                j = _rows(js, device)
                r = [t.random_rows[k] for k in js]
                xr = x if len(r) == len(rows) else x[_rows(r, device)]
                if truncated:
                    picked = _sample_truncated(xr, t, j, _pick(fire, j), u[j], cand_of(r))
                else:
                    picked = _sample_plain(xr, t, j, _pick(fire, j), u[j])
                tokens[_rows(r, device)] = picked

        token_ids = tokens.tolist()
        if all(n is None for n in t.num_logprobs):
            return SamplerOutput(token_ids, [None] * len(rows))
        lp_cand = cand_of([i for i, n in enumerate(t.num_logprobs) if n])
        return SamplerOutput(token_ids, _top_logprobs(x, token_ids, t.num_logprobs, lp_cand))

    def score(self, logits: torch.Tensor, rows: list[SamplingRow], token_ids: list[int]) -> list[TokenLogprob]:
        """Logprobs of given (forced) tokens under the same processing, no sampling;
        top-N per row.params.logprobs (0/None -> no alternatives)."""
        if not rows:
            return []
        t = SamplingTensors.build(rows, logits.shape[1], logits.device)
        out = _top_logprobs(_process(logits, t), list(token_ids), [n or 0 for n in t.num_logprobs])
        return out  # type: ignore[return-value]
