"""Constrained decoding: the one small interface around the grammar library.

`StructuredOutputCompiler.compile(spec)` turns a `StructuredOutputSpec` (a JSON
schema, "any JSON object", or a regex) into a compiled grammar, cached by the spec's
canonical text, so a repeated schema costs nothing; it raises `RequestError` for a
schema or regex the library cannot follow exactly. `matcher(compiled, eos)` makes a
per-request `GrammarMatcher`: `allowed_token_bitmask()` is the set of tokens that
keep the output inside the grammar (the request's EOS ids only where the grammar may
end), `accept(token)` advances it, `is_terminated()` says the grammar has ended (an
EOS was accepted). `apply_bitmasks` sets the disallowed logits of a batch's
constrained rows to -inf, on the logits' own device.

The library is xgrammar, chosen by measurement (benchmarks/structured_output.py):
on SmolLM2's 49,152-token vocabulary and a nested schema, a mask costs ~6 us per
token (llguidance ~150 us, outlines-core ~90 us) and a compile ~70 ms (outlines-core
~1.9 s; llguidance compiles lazily, in its first masks). Nothing outside this
module imports it.

What xgrammar would silently ignore is refused instead, so that every output that
ends by the grammar validates against the schema as given: see `UNSUPPORTED_KEYWORDS`
and `check_regex` (the spec's regex limits: no anchors or lookaround, no Unicode
property escapes, no back-references or conditionals).
"""

import json
import re
import threading
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from amity.engine.errors import RequestError

KINDS = ("json_schema", "json_object", "regex", "text")

# JSON Schema keywords that xgrammar 0.2.9 accepts but does not enforce (or only
# approximates): a schema using any of them is refused with a 422 naming it.
UNSUPPORTED_KEYWORDS = frozenset({
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
    "contains", "minContains", "maxContains", "propertyNames", "unevaluatedProperties",
    "unevaluatedItems", "oneOf", "patternProperties", "$dynamicRef", "$recursiveRef",
})


@dataclass(frozen=True)
class StructuredOutputSpec:
    """What the output must follow. `payload`: the schema (a dict) for json_schema, the
    pattern for regex, None for json_object and text (text constrains nothing)."""

    kind: str
    payload: Any = None
    # The request field a refusal names (the tools, for a forced tool call).
    field: str = "response_format"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise RequestError(f"structured output kind {self.kind!r} is not one of {list(KINDS)}",
                               self.field)
        if self.kind == "json_schema" and not isinstance(self.payload, (dict, bool)):
            raise RequestError("a `json_schema` response format needs a JSON Schema object",
                               self.field)
        if self.kind == "regex" and not isinstance(self.payload, str):
            raise RequestError("a `regex` response format needs the pattern as a string",
                               self.field)

    @property
    def constrains(self) -> bool:
        return self.kind != "text"

    def cache_key(self) -> str:  # `field` only names errors: not part of the key
        return self.kind + "\0" + json.dumps(self.payload, sort_keys=True, separators=(",", ":"))


# ---------------------------------------------------------------- checks


def _keywords_in(schema: Any, path: str = "#"):
    """(keyword, path) for every schema keyword, walking only schema positions (so a
    property *named* "not" is not taken for the keyword)."""
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        here = f"{path}/{key}"
        yield key, here
        if key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"):
            if isinstance(value, dict):
                for name, sub in value.items():
                    yield from _keywords_in(sub, f"{here}/{name}")
        elif key in ("items", "additionalProperties", "additionalItems", "not", "if", "then",
                     "else", "contains", "propertyNames", "unevaluatedProperties",
                     "unevaluatedItems"):
            if isinstance(value, list):
                for i, sub in enumerate(value):
                    yield from _keywords_in(sub, f"{here}/{i}")
            else:
                yield from _keywords_in(value, here)
        elif key in ("anyOf", "allOf", "oneOf", "prefixItems") and isinstance(value, list):
            for i, sub in enumerate(value):
                yield from _keywords_in(sub, f"{here}/{i}")


def check_schema(schema: Any, field: str = "response_format") -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise RequestError("the JSON schema must be an object", field)
    bad = sorted({(k, p) for k, p in _keywords_in(schema) if k in UNSUPPORTED_KEYWORDS},
                 key=lambda kp: kp[1])
    if bad:
        names = sorted({k for k, _ in bad})
        raise RequestError(
            f"the JSON schema uses {', '.join(repr(n) for n in names)} (at {bad[0][1]}), which "
            "structured output does not enforce; rewrite the schema without "
            f"{'it' if len(names) == 1 else 'them'}", field)


_REGEX_REFUSED = [
    # (what the spec calls it, the construct's pattern over the regex source)
    ("lookahead `(?=...)`", r"\(\?="), ("negative lookahead `(?!...)`", r"\(\?!"),
    ("lookbehind `(?<=...)`", r"\(\?<="), ("negative lookbehind `(?<!...)`", r"\(\?<!"),
    ("conditional `(?(...)`", r"\(\?\("), ("named back-reference `(?P=...)`", r"\(\?P="),
]


def check_regex(pattern: str) -> None:
    """Refuse what the spec lists as unsupported, naming the construct: anchors and
    lookaround (`\\A`, `\\z`, `\\Z`, `\\b`, `\\B`, `^`, `$`, `(?=`, `(?!`, `(?<=`,
    `(?<!`), Unicode escapes (`\\N`, `\\p`, `\\P`), back-references and conditionals.
    The output always matches the whole pattern, so anchors are never needed."""
    for name, construct in _REGEX_REFUSED:
        if re.search(construct, pattern):
            raise RequestError(f"the regex uses a {name}, which is not supported", "response_format")
    i, in_class = 0, False
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            if nxt in "AzZbBaG" and not (in_class and nxt in "ab"):
                raise RequestError(f"the regex uses the anchor or assertion `\\{nxt}`, which is "
                                   "not supported (the whole output always matches the pattern)",
                                   "response_format")
            if nxt in "NpP":
                raise RequestError(f"the regex uses the Unicode escape `\\{nxt}`, which is not "
                                   "supported", "response_format")
            if not in_class and (nxt.isdigit() and nxt != "0" or nxt == "k"):
                raise RequestError(f"the regex uses a back-reference (`\\{nxt}`), which is not "
                                   "supported", "response_format")
            i += 2
            continue
        if in_class:
            if ch == "]":
                in_class = False
        elif ch == "[":
            in_class = True
            # `[]...]` and `[^]...]` hold a literal ] first.
            j = i + 1 + (pattern[i + 1:i + 2] == "^")
            if pattern[j:j + 1] == "]":
                i = j
        elif ch in "^$":
            raise RequestError(f"the regex uses the anchor `{ch}`, which is not supported (the "
                               "whole output always matches the pattern)", "response_format")
        i += 1
    try:
        re.compile(pattern)
    except re.error as err:
        raise RequestError(f"the regex does not parse: {err}", "response_format") from None


# ---------------------------------------------------------------- the library

class StructuredOutputCompiler:
    """One per engine (one tokenizer). Thread-safe: the server compiles on worker
    threads while the engine thread makes matchers."""

    def __init__(self, hf_tokenizer, vocab_size: int, eos_token_ids, cache_size: int = 256):
        import xgrammar as xgr  # the only place the library is imported

        self._xgr = xgr
        self.vocab_size = vocab_size
        # A model without EOS: every matcher overrides the stop tokens with its request's
        # `eos_token` (validation refuses a grammar without), so the library's guess is unused.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            self._info = xgr.TokenizerInfo.from_huggingface(
                hf_tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(eos_token_ids) or None)
        # Our own cache (below) is keyed by the canonical spec; the library's stays off.
        self._compiler = xgr.GrammarCompiler(self._info, cache_enabled=False)
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.num_compiles = 0

    def compile(self, spec: StructuredOutputSpec):
        """The compiled grammar for `spec` (None for text). RequestError if refused."""
        if not spec.constrains:
            return None
        key = spec.cache_key()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        compiled = self._compile(spec)
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            self.num_compiles += 1
        return compiled

    def _compile(self, spec: StructuredOutputSpec):
        try:
            if spec.kind == "json_object":
                return self._compiler.compile_json_schema(
                    '{"type": "object"}', any_whitespace=False, strict_mode=False)
            if spec.kind == "json_schema":
                check_schema(spec.payload, spec.field)
                return self._compiler.compile_json_schema(
                    json.dumps(spec.payload), any_whitespace=False, strict_mode=True)
            check_regex(spec.payload)
            return self._compiler.compile_regex(spec.payload)
        except RequestError:
            raise
        except Exception as err:  # the library's own refusal: an invalid or unsupported input
            what = "JSON schema" if spec.kind == "json_schema" else "regex"
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            message = re.sub(r"^\[[\d:]+\] \S+: ", "", message)  # the C++ source position
            raise RequestError(f"the {what} cannot be used for structured output: {message}",
                               spec.field) from None

    def matcher(self, compiled, eos_token_ids) -> "GrammarMatcher":
        return GrammarMatcher(self, compiled, sorted(eos_token_ids))


class GrammarMatcher:
    """One request's position in its grammar."""

    def __init__(self, owner: StructuredOutputCompiler, compiled, eos_token_ids: list[int]):
        xgr = owner._xgr
        self._matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=eos_token_ids or None)
        self._bitmask = xgr.allocate_token_bitmask(1, owner.vocab_size)
        self.vocab_size = owner.vocab_size

    def fill_bitmask(self, out: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(out, row)

    def allowed_token_bitmask(self) -> torch.Tensor:
        """int32 [ceil(V / 32)]: bit t % 32 of word t // 32 is set when token t is allowed."""
        self._matcher.fill_next_token_bitmask(self._bitmask, 0)
        return self._bitmask[0]

    def accept(self, token_id: int) -> bool:
        return self._matcher.accept_token(token_id)

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()


def bitmask_width(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def apply_bitmasks(logits: torch.Tensor, rows: list[int], matchers: list[GrammarMatcher]) -> None:
    """In place: logits[rows[i], t] = -inf wherever matchers[i] disallows t. One
    [k, V/32] bitmask is filled on the CPU, shipped once, and unpacked on the device."""
    if not rows:
        return
    vocab = logits.shape[-1]
    width = bitmask_width(matchers[0].vocab_size)
    masks = torch.empty((len(rows), width), dtype=torch.int32)
    for i, m in enumerate(matchers):
        m.fill_bitmask(masks, i)
    device = logits.device
    shifts = _SHIFTS.get(device)
    if shifts is None:
        shifts = _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    bits = (masks.to(device, non_blocking=True).unsqueeze(-1) >> shifts) & 1
    allowed = bits.view(len(rows), width * 32).bool()
    if allowed.shape[1] < vocab:  # logits wider than the tokenizer's vocabulary: pad, disallowed
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    index = torch.tensor(rows, dtype=torch.long, device=device)
    sub = logits.index_select(0, index)
    sub.masked_fill_(~allowed[:, :vocab], float("-inf"))
    logits.index_copy_(0, index, sub)
