"""The batched sampler: one next token (and optionally its logprobs) per row.

Pipeline, in this fixed order, over a [B, V] float32 copy of the logits. Each
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
 7. temperature         temperature 0 rows are greedy: their token is the argmax
                        of the stage-5 logits and stages 7-9 skip them.
 8. top_k, top_p, min_p, then XTC, each on the distribution left by the ones
                        before it (renormalized). XTC fires with probability
                        xtc_probability per step: one uniform from the row's
                        generator, drawn only when xtc_probability > 0 and
                        xtc_threshold > 0, before the sampling draw.
 9. sample              greedy rows: argmax; random rows: an exponential race on
                        the row's own generator (see `exponential_race`), so a
                        row's draw depends only on its seed and state.

Everything history-derived (bans, penalty token lists) is computed per row in
Python/CPU by `SamplingTensors.build`, then shipped to the logits' device once.
Token ids outside [0, V) in histories, bans or biases are ignored.
"""

from dataclasses import dataclass

import torch

from amity.engine import logits_processors as lp
from amity.engine.outputs import TokenLogprob
from amity.engine.sampling_params import SamplingParams


@dataclass
class SamplingRow:
    """One sequence to sample for, as plain Python state."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None  # the request's own generator; None when greedy
    eos_token_ids: frozenset[int]  # already resolved (params.eos_token or the model's)


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row
    logprobs: list[TokenLogprob | None]  # per row; None when params.logprobs is None


def _padded(seqs: list[list[int]], pad: int, device: torch.device) -> torch.Tensor:
    width = max(1, max(len(s) for s in seqs))
    return torch.tensor([s + [pad] * (width - len(s)) for s in seqs], dtype=torch.long, device=device)


def _rows(idx: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(idx, dtype=torch.long, device=device)


def _floats(vals: list[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(vals, dtype=torch.float32, device=device)


@dataclass
class SamplingTensors:
    """A batch's parameters as device tensors; None marks a stage to skip."""

    # Stage 1: flat (row, token, bias).
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    # Stages 2-4: flat (row, token) to set to -inf.
    bans: tuple[torch.Tensor, torch.Tensor] | None
    # Stage 5: (rows, padded prompt+output ids, penalty).
    repetition: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    # Stage 5: (rows, padded output ids, frequency, presence).
    frequency: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None
    # Stage 6: top-N per row, None for no logprobs.
    num_logprobs: list[int | None]
    # Stages 7-9 cover the random rows only; values below are per random row.
    random_rows: list[int]
    generators: list[torch.Generator | None]  # checked by the sampler, not needed to score
    temperature: torch.Tensor | None
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    # XTC: (threshold, probability) for random rows; probability 0 = never.
    xtc: tuple[torch.Tensor, list[float]] | None

    @classmethod
    def build(cls, rows: list[SamplingRow], vocab_size: int, device: torch.device) -> "SamplingTensors":
        def valid(t: int) -> bool:
            return 0 <= t < vocab_size

        bias_r, bias_t, bias_v = [], [], []
        ban_r, ban_t = [], []
        rep_i, rep_ids, rep_p = [], [], []
        freq_i, freq_ids, freq_f, freq_p = [], [], [], []
        for i, row in enumerate(rows):
            p = row.params
            history = row.prompt_token_ids + row.output_token_ids
            for tok, b in (p.logit_bias or {}).items():
                if valid(int(tok)):
                    bias_r.append(i)
                    bias_t.append(int(tok))
                    bias_v.append(float(b))
            banned = lp.bad_word_bans(history, p.bad_word_tokens)
            banned += lp.no_repeat_ngram_bans(history, p.no_repeat_ngram)
            banned += lp.min_length_bans(
                len(row.prompt_token_ids),
                len(row.output_token_ids),
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
                rep_i.append(i)
                rep_ids.append(history)
                rep_p.append(p.repetition_penalty)
            if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
                freq_i.append(i)
                freq_ids.append(row.output_token_ids)
                freq_f.append(p.frequency_penalty)
                freq_p.append(p.presence_penalty)

        random_rows = [i for i, r in enumerate(rows) if not r.params.is_greedy]
        rp = [rows[i].params for i in random_rows]

        def per_random(values: list, used: bool, dtype=torch.float32) -> torch.Tensor | None:
            return torch.tensor(values, dtype=dtype, device=device) if used else None

        xtc_on = [q.xtc_probability > 0 and q.xtc_threshold > 0 for q in rp]
        xtc_threshold = [q.xtc_threshold if on else 0.0 for q, on in zip(rp, xtc_on)]
        xtc_chance = [q.xtc_probability if on else 0.0 for q, on in zip(rp, xtc_on)]
        return cls(
            bias=(_rows(bias_r, device), _rows(bias_t, device), _floats(bias_v, device)) if bias_r else None,
            bans=(_rows(ban_r, device), _rows(ban_t, device)) if ban_r else None,
            repetition=(_rows(rep_i, device), _padded(rep_ids, vocab_size, device), _floats(rep_p, device))
            if rep_i
            else None,
            frequency=(
                _rows(freq_i, device),
                _padded(freq_ids, vocab_size, device),
                _floats(freq_f, device),
                _floats(freq_p, device),
            )
            if freq_i
            else None,
            num_logprobs=[r.params.logprobs for r in rows],
            random_rows=random_rows,
            generators=[rows[i].generator for i in random_rows],
            temperature=per_random([q.temperature for q in rp], any(q.temperature != 1.0 for q in rp)),
            top_k=per_random([q.top_k for q in rp], any(0 < q.top_k < vocab_size for q in rp), torch.long),
            top_p=per_random([q.top_p for q in rp], any(q.top_p < 1.0 for q in rp)),
            min_p=per_random([q.min_p for q in rp], any(q.min_p > 0.0 for q in rp)),
            xtc=(_floats(xtc_threshold, device), xtc_chance) if any(xtc_on) else None,
        )


def _process(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """Stages 1-5 on a float32 copy: the distribution logprobs report."""
    x = logits.to(torch.float32, copy=True)
    if t.bias is not None:
        r, tok, v = t.bias
        x.index_put_((r, tok), v, accumulate=True)
    if t.bans is not None:
        x[t.bans] = lp.NEG_INF
    if t.repetition is not None:
        r, ids, pen = t.repetition
        sub = x[r]
        lp.apply_repetition_penalty(sub, ids, pen)
        x[r] = sub
    if t.frequency is not None:
        r, ids, f, pres = t.frequency
        sub = x[r]
        lp.apply_frequency_presence(sub, ids, f, pres)
        x[r] = sub
    return x


def _top_logprobs(logprobs: torch.Tensor, chosen: list[int], num: list[int | None]) -> list[TokenLogprob | None]:
    want = [i for i, n in enumerate(num) if n is not None]
    out: list[TokenLogprob | None] = [None] * len(num)
    if not want:
        return out
    idx = _rows(want, logprobs.device)
    sub = logprobs[idx]
    chosen_lp = sub.gather(1, _rows([chosen[i] for i in want], logprobs.device)[:, None])[:, 0].tolist()
    top_v, top_i = sub.topk(min(max(num[i] for i in want), sub.shape[1]), dim=1)
    top_v, top_i = top_v.tolist(), top_i.tolist()
    for j, i in enumerate(want):
        n = num[i]
        out[i] = TokenLogprob(chosen[i], chosen_lp[j], list(zip(top_i[j][:n], top_v[j][:n])))
    return out


class Sampler:
    def processed_logits(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        """Stages 1-5: the float32 logits whose log_softmax logprobs report."""
        return _process(logits, SamplingTensors.build(rows, logits.shape[1], logits.device))

    def __call__(self, logits: torch.Tensor, rows: list[SamplingRow]) -> SamplerOutput:
        if not rows:
            return SamplerOutput([], [])
        t = SamplingTensors.build(rows, logits.shape[1], logits.device)
        x = _process(logits, t)

        # Stage 6 reads the stage-5 logits, so take them before stage 7 edits.
        want_lp = any(n is not None for n in t.num_logprobs)
        logprobs = x.log_softmax(dim=1) if want_lp else None
        tokens = x.argmax(dim=1)

        if t.random_rows:
            missing = [i for i, g in zip(t.random_rows, t.generators) if g is None]
            if missing:
                raise ValueError(f"rows {missing} sample (temperature > 0) but have no generator")
            r = _rows(t.random_rows, x.device)
            sub = x[r] if len(t.random_rows) < len(rows) else x
            if t.temperature is not None:
                lp.apply_temperature(sub, t.temperature)
            if t.top_k is not None:
                lp.apply_top_k(sub, t.top_k)
            if t.top_p is not None:
                lp.apply_top_p(sub, t.top_p)
            if t.min_p is not None:
                lp.apply_min_p(sub, t.min_p)
            if t.xtc is not None:
                threshold, chance = t.xtc
                # Drawn in row order before the sampling draw; rows with XTC off
                # draw nothing, so their streams match a batch without XTC.
                u = [
                    torch.rand(1, generator=g, device=g.device).to(sub.device)
                    if c > 0
                    else torch.ones(1, device=sub.device)
                    for g, c in zip(t.generators, chance)
                ]
                fire = torch.cat(u) < _floats(chance, sub.device)
                lp.apply_xtc(sub, threshold, fire)
            tokens[r] = lp.exponential_race(sub.softmax(dim=1), t.generators)

        token_ids = tokens.tolist()
        if logprobs is None:
            return SamplerOutput(token_ids, [None] * len(rows))
        return SamplerOutput(token_ids, _top_logprobs(logprobs, token_ids, t.num_logprobs))

    def score(self, logits: torch.Tensor, rows: list[SamplingRow], token_ids: list[int]) -> list[TokenLogprob]:
        """Logprobs of given (forced) tokens under the same processing, no sampling;
        top-N per row.params.logprobs (0/None -> no alternatives)."""
        if not rows:
            return []
        t = SamplingTensors.build(rows, logits.shape[1], logits.device)
        logprobs = _process(logits, t).log_softmax(dim=1)
        out = _top_logprobs(logprobs, list(token_ids), [n or 0 for n in t.num_logprobs])
        return out  # type: ignore[return-value]
