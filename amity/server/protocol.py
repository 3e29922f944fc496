"""The one translation step between the wire and the engine.

Inbound: a validated wire body becomes prompt token ids and a `SamplingParams`; every
problem found here, or raised by `SamplingParams` or the engine as a `RequestError`,
becomes an `InvalidRequest` that the app renders as a 422 naming the field to change.
Outbound: engine logprobs become the OpenAI/Friendli logprob shapes.
"""

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from amity.engine.errors import RequestError
from amity.engine.outputs import TokenLogprob
from amity.engine.sampling_params import MAX_CHOICES_PER_REQUEST, SamplingParams
from amity.engine.structured_output import StructuredOutputSpec
from amity.models.tokenizer import Tokenizer
from amity.server import schemas as s


class InvalidRequest(Exception):
    """A 422: `loc` is the path into the body, as FastAPI reports it."""

    def __init__(self, msg: str, loc: Iterable[str | int] = (), type: str = "value_error"):
        super().__init__(msg)
        self.msg = msg
        self.loc = ["body", *loc]
        self.type = type

    @classmethod
    def from_request_error(cls, err: RequestError, wire_names: dict[str, str] | None = None
                           ) -> "InvalidRequest":
        """`wire_names` maps SamplingParams' names to an API's own (Messages:
        `stop` is `stop_sequences`), so the error names the field the client sent."""
        names = wire_names or {}
        message = err.message
        if err.field in names:
            message = message.replace(f"`{err.field}`", f"`{names[err.field]}`")
        return cls(message, [names.get(err.field, err.field)] if err.field else [])

    def detail(self) -> list[dict]:
        return [{"loc": self.loc, "msg": self.msg, "type": self.type}]


@dataclass
class ModelInfo:
    """What translation needs to know about the served model."""

    tokenizer: Tokenizer
    vocab_size: int
    max_model_len: int


def check_num_choices(num_prompts: int, n: int) -> None:
    """A prompt list multiplies the choices: the engine's cap holds for their product."""
    total = num_prompts * n
    if total > MAX_CHOICES_PER_REQUEST:
        what = f"n={n}" if num_prompts == 1 else f"{num_prompts} prompts x n={n}"
        raise InvalidRequest(
            f"this request asks for {total} choices ({what}); a request may ask for at most "
            f"{MAX_CHOICES_PER_REQUEST}: lower `n`" + (" or send fewer prompts" if num_prompts > 1 else ""),
            ["n"],
        )


def make_sampling_params(fields: dict, wire_names: dict[str, str] | None = None) -> SamplingParams:
    """`fields` uses SamplingParams' names; None values mean "the default"."""
    try:
        return SamplingParams(**{k: v for k, v in fields.items() if v is not None})
    except RequestError as err:
        raise InvalidRequest.from_request_error(err, wire_names) from None


def with_structured_output(params: SamplingParams, spec: StructuredOutputSpec,
                           wire_names: dict[str, str] | None = None) -> SamplingParams:
    """`params` constrained by `spec` (issue 5), revalidated (min_tokens and stops are
    refused)."""
    try:
        return dataclasses.replace(params, structured_output=spec)
    except RequestError as err:
        raise InvalidRequest.from_request_error(err, wire_names) from None


def check_token_ids(ids: list[int], vocab_size: int, loc: list[str | int]) -> None:
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise InvalidRequest(
                f"token id {t} is outside the vocabulary; ids must be in [0, {vocab_size - 1}]",
                [*loc, i],
            )


def check_prompt(ids: list[int], info: ModelInfo, loc: list[str | int]) -> None:
    if not ids:
        raise InvalidRequest("the prompt is empty; give at least one token of input", loc)
    check_token_ids(ids, info.vocab_size, loc)
    # At least one token must fit after the prompt; the engine checks max_tokens itself.
    if len(ids) >= info.max_model_len:
        raise InvalidRequest(
            f"the prompt is {len(ids)} tokens but the context is {info.max_model_len}; "
            f"shorten it to at most {info.max_model_len - 1} tokens",
            loc,
        )


def _token_sequences(seqs: list[s.TokenSequence] | None, info: ModelInfo, name: str):
    if seqs is None:
        return None
    out = []
    for i, seq in enumerate(seqs):
        tokens = seq.tokens or []
        check_token_ids(tokens, info.vocab_size, [name, i, "tokens"])
        out.append(tokens)
    return out


def bad_word_tokens(words: list[str], tokenizer: Tokenizer) -> list[list[int]]:
    """Each phrase both with and without a leading space: a BPE vocabulary tokenizes
    "clear" and " clear" differently, and the spec asks that both be banned. A word of
    only whitespace is refused: its variants are bare spaces, and banning the space token
    is never what an empty entry meant."""
    out: list[list[int]] = []
    for i, word in enumerate(words):
        if not word.strip():
            raise InvalidRequest(f"`bad_words` entry {word!r} holds no word; remove it",
                                 ["bad_words", i])
        bare = word[1:] if word.startswith(" ") else word
        for variant in (bare, " " + bare):
            ids = tokenizer.encode(variant, add_special_tokens=False)
            if ids and ids not in out:
                out.append(ids)
    return out


def check_response_format(body: s.GenerationFields) -> StructuredOutputSpec | None:
    """`response_format` as the engine's structured-output spec (issue 5); the grammar is
    compiled (and a bad schema or regex refused) when the request is submitted."""
    fmt = body.response_format
    if fmt is None:
        return None
    if body.min_tokens:
        raise InvalidRequest(
            "`min_tokens` is unsupported together with `response_format`; drop one of them",
            ["min_tokens"],
        )
    if fmt.type == "text":
        return None
    if fmt.type == "json_schema":
        return StructuredOutputSpec("json_schema", fmt.json_schema.schema_)
    if fmt.type == "regex":
        return StructuredOutputSpec("regex", fmt.schema_)
    return StructuredOutputSpec("json_object")


def tool_call_spec(tools: list[dict] | None, name: str | None, parallel: bool,
                   loc: str = "tool_choice") -> StructuredOutputSpec:
    """A forced tool call (issue 5) as a JSON schema over what `ToolCallStream` reads
    back: `{"name": N, "arguments": {...}}`, each call's arguments following its tool's
    parameters. `name` forces exactly one call of that tool; None allows any of
    `tools`: one call, or with `parallel` a non-empty array of calls."""
    if not tools:
        raise InvalidRequest(f"`{loc}` forces a tool call but no `tools` are given", [loc])
    if name is not None:
        tools = [t for t in tools if t["function"]["name"] == name]
        if not tools:
            raise InvalidRequest(f"`{loc}` names the tool {name!r}, which is not in `tools`", [loc])
    calls = []
    for t in tools:
        fn = t["function"]
        params = fn.get("parameters") or {"type": "object", "properties": {}}
        calls.append({"type": "object", "properties": {"name": {"const": fn["name"]},
                                                       "arguments": params},
                      "required": ["name", "arguments"]})
    call = calls[0] if len(calls) == 1 else {"anyOf": calls}
    # A named choice is one call: an array of them would let a model that repeats
    # itself (greedy SmolLM2 does) call the same function until max_tokens.
    schema = {"type": "array", "items": call, "minItems": 1} if parallel and name is None else call
    return StructuredOutputSpec("json_schema", schema, field="tools")


def generation_fields(body: s.GenerationFields, info: ModelInfo) -> dict:
    """The fields completions and chat share, in SamplingParams' names."""
    structured = check_response_format(body)
    if body.eos_token is not None:
        check_token_ids(body.eos_token, info.vocab_size, ["eos_token"])
    return {
        "n": body.n,
        "temperature": body.temperature,
        "top_k": body.top_k,
        "top_p": body.top_p,
        "min_p": body.min_p,
        "xtc_threshold": body.xtc_threshold,
        "xtc_probability": body.xtc_probability,
        "repetition_penalty": body.repetition_penalty,
        "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty,
        "seed": body.seed,
        "stop": body.stop,
        "eos_token": body.eos_token,
        "max_tokens": body.max_tokens,
        "min_tokens": body.min_tokens,
        "structured_output": structured,
    }


def completions_request(
    body: s.CompletionsBody, info: ModelInfo
) -> tuple[list[list[int]], SamplingParams]:
    """Prompt ids (one list per prompt: a list of strings is several prompts) and params."""
    if body.tokens is not None:
        prompts = [body.tokens]
        check_prompt(body.tokens, info, ["tokens"])
    else:
        texts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        prompts = [info.tokenizer.encode(t) for t in texts]
        for i, ids in enumerate(prompts):
            check_prompt(ids, info, ["prompt"] if isinstance(body.prompt, str) else ["prompt", i])
    if (body.embedding_to_replace is None) != (body.token_index_to_replace is None):
        raise InvalidRequest(
            "`embedding_to_replace` and `token_index_to_replace` go together; give both or neither",
            ["token_index_to_replace"],
        )
    if body.forced_output_tokens is not None:
        check_token_ids(body.forced_output_tokens, info.vocab_size, ["forced_output_tokens"])
    bad = _token_sequences(body.bad_word_tokens, info, "bad_word_tokens") or []
    if body.bad_words:
        bad = bad + [t for t in bad_word_tokens(body.bad_words, info.tokenizer) if t not in bad]
    fields = generation_fields(body, info) | {
        "logprobs": body.logprobs,
        "max_total_tokens": body.max_total_tokens,
        "min_total_tokens": body.min_total_tokens,
        "no_repeat_ngram": body.no_repeat_ngram,
        "encoder_no_repeat_ngram": body.encoder_no_repeat_ngram,
        "encoder_repetition_penalty": body.encoder_repetition_penalty,
        "forced_output_tokens": body.forced_output_tokens,
        "bad_word_tokens": bad,
        "stop_tokens": _token_sequences(body.stop_tokens, info, "stop_tokens"),
    }
    return prompts, make_sampling_params(fields)


def chat_sampling_params(body: s.ChatCompletionBody, info: ModelInfo) -> SamplingParams:
    logit_bias = None
    if body.logit_bias is not None:
        logit_bias = {}
        for key, bias in body.logit_bias.items():
            try:
                token = int(key)
            except ValueError:
                raise InvalidRequest(
                    f"`logit_bias` keys are token ids as strings; {key!r} is not one",
                    ["logit_bias", key],
                ) from None
            check_token_ids([token], info.vocab_size, ["logit_bias"])
            logit_bias[token] = bias
    fields = generation_fields(body, info)
    if body.max_completion_tokens is not None:
        fields["max_tokens"] = body.max_completion_tokens
    if body.logprobs:
        fields["logprobs"] = body.top_logprobs or 0
    fields["logit_bias"] = logit_bias
    return make_sampling_params(fields)


# ---------------------------------------------------------------- outbound


class TokenPieces:
    """Each token's text and raw bytes, for logprobs. Byte-level BPE vocabularies spell
    bytes as printable characters; mapping them back gives the exact bytes even for a
    token that holds half of a UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._byte_of = {ch: b for b, ch in _bytes_to_unicode().items()}
        self.piece = lru_cache(maxsize=65536)(self._piece)

    def _piece(self, token_id: int) -> tuple[str, list[int]]:
        token = self.tokenizer.id_to_token(token_id) or ""
        if token and all(ch in self._byte_of for ch in token):
            raw = bytes(self._byte_of[ch] for ch in token)
        else:
            raw = self.tokenizer.decode([token_id], skip_special_tokens=False).encode()
        return raw.decode("utf-8", errors="replace"), list(raw)


@lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's table, as every byte-level BPE tokenizer uses it.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def completions_logprobs(
    logprobs: list[TokenLogprob], pieces: TokenPieces, text_offset: int
) -> s.CompletionsLogprobs:
    """`text_offset` is where the first of these tokens starts in the generated text."""
    out = s.CompletionsLogprobs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
    for lp in logprobs:
        text, _ = pieces.piece(lp.token_id)
        out.text_offset.append(text_offset)
        out.token_logprobs.append(lp.logprob)
        out.tokens.append(text)
        out.top_logprobs.append({pieces.piece(t)[0]: v for t, v in lp.top})
        text_offset += len(text)
    return out


def chat_logprobs(logprobs: list[TokenLogprob], pieces: TokenPieces) -> s.ChatLogprobs:
    content = []
    for lp in logprobs:
        text, raw = pieces.piece(lp.token_id)
        top = []
        for t, v in lp.top:
            t_text, t_raw = pieces.piece(t)
            top.append(s.TopLogprob(token=t_text, logprob=v, bytes=t_raw))
        content.append(
            s.ChatLogprobsContent(token=text, logprob=lp.logprob, bytes=raw, top_logprobs=top)
        )
    return s.ChatLogprobs(content=content)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> s.Usage:
    return s.Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=s.PromptTokensDetails(cached_tokens=cached_tokens),
    )
