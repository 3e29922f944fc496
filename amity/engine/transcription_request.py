"""A transcription as the engine sees it: its parameters, its windows, and its state.

A recording is cut into windows of at most 30 s (amity/audio/chunking.py). Window by
window, the request waits for its encoder pass, then decodes: its decoder prompt is
`<|startofprev|>` + the previous windows' last text tokens (Whisper's conditioning on
previous text), then `<|startoftranscript|>`, the language, the task and
`<|notimestamps|>`. On a multilingual model without a language, the first window's
prompt is `<|startoftranscript|>` alone until the language is read from its logits
(as `transformers`' `detect_language`), and that language holds for every window.
"""

import enum
import time
from dataclasses import dataclass, field

import torch

from amity.models.whisper import CrossKV

# OpenAI's Whisper keeps at most n_text_ctx // 2 - 1 previous tokens in the prompt.
MAX_PREVIOUS_TOKENS = 223


@dataclass(frozen=True)
class VadOptions:
    """OpenAI's server_vad fields and defaults."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 200


@dataclass(frozen=True)
class TranscriptionParams:
    language: str | None = None  # ISO-639-1; None: detect (multilingual) or English
    task: str = "transcribe"  # or "translate" (to English)
    temperature: float = 0.0  # 0: greedy
    seed: int | None = None
    # None: the whole file, windows back to back; else cut where VAD hears pauses.
    vad: VadOptions | None = None
    n: int = 1  # one transcript per request (the server's Generation reads `n`)


@dataclass
class PreparedTranscription:
    """What `validate` makes of a request off the engine thread."""

    params: TranscriptionParams
    features: list[torch.Tensor]  # log-mel [mel bins, 3000] of each window
    window_samples: list[int]  # the audio each window holds
    input_audio_ms: int
    language_id: int | None  # the language token; None: to detect (or English-only)


class Phase(enum.Enum):
    ENCODE = "encode"  # waiting for the next window's encoder pass
    DECODE = "decode"
    FINISHED = "finished"


@dataclass(eq=False)  # identity: requests sit in queues and dicts
class TranscriptionRequest:
    request_id: str
    prepared: PreparedTranscription
    generator: torch.Generator | None
    arrival_time: float = field(default_factory=time.monotonic)
    phase: Phase = Phase.ENCODE
    window: int = 0
    language_id: int | None = None
    cross: CrossKV | None = None
    # The current window's decoder tokens (prompt, then output) and how far computed.
    token_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    detecting_language: bool = False
    # What the KV cache manager needs (no prefix caching here).
    block_table: list[int] = field(default_factory=list)
    num_published_blocks: int = 0
    # Across windows.
    text_token_ids: list[int] = field(default_factory=list)  # every window's text tokens
    finished_text: str = ""  # the finished windows' text
    emitted_text: str = ""  # what the outputs have carried so far
    new_token_ids: list[int] = field(default_factory=list)  # since the last output
    total_prompt_tokens: int = 0
    total_output_tokens: int = 0
    finish_reason: str | None = None

    @property
    def num_windows(self) -> int:
        return len(self.prepared.features)

    @property
    def window_output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]
