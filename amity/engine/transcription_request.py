"""A transcription as the engine sees it: its parameters, its audio, and its state.

The audio is log-mel feature blocks: the whole recording as one block, read as Whisper
reads a long file (a 30 s window from `seek`, decoded with timestamps; the next window
starts where the last complete segment ended), or, under VAD chunking, one block per
speech window of at most 30 s, each decoded once without timestamps. Window by window,
the request waits for its encoder pass, then decodes: its decoder prompt is
`<|startofprev|>` + the previous windows' last tokens (Whisper's conditioning on previous
text), then `<|startoftranscript|>`, the language, the task (and `<|notimestamps|>` for
VAD windows). On a multilingual model without a language, the first window's prompt is
`<|startoftranscript|>` alone until the language is read from its logits (as
`transformers`' `detect_language`), and that language holds for every window.
"""

import enum
import time
from dataclasses import dataclass, field

import torch

from amity.engine.transcription_fallback import Attempt
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
    # False: each window decoded once at `temperature` (as transformers' generate with one
    # temperature; the parity tests), never again hotter (transcription_fallback.py); its
    # text then streams as it becomes final, not a window at a time.
    temperature_fallback: bool = True
    n: int = 1  # one transcript per request (the server's Generation reads `n`)


@dataclass
class PreparedTranscription:
    """What `validate` makes of a request off the engine thread."""

    params: TranscriptionParams
    # Log-mel blocks [mel bins, frames]: the whole file (frames >= 3000), or VAD windows (3000 each).
    features: list[torch.Tensor]
    timestamps: bool  # decode with timestamps and seek through each block (the whole file)
    window_samples: list[int]  # the audio each block holds
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
    block: int = 0  # which feature block
    seek: int = 0  # log-mel frames into the block: where the current window starts
    temperatures: tuple[float, ...] = (0.0,)  # this window's tries, in order
    failed_attempts: list[Attempt] = field(default_factory=list)  # this window's tries so far
    sum_logprob: float = 0.0  # of this try's output tokens
    language_id: int | None = None
    cross: CrossKV | None = None
    # The current window's decoder tokens (prompt, then output) and how far computed.
    token_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    # How many of the window's output tokens are final before the window ends (streamed
    # as they are): only when no fallback can decode the window again.
    num_final_output_tokens: int = 0
    detecting_language: bool = False
    # What the KV cache manager needs (no prefix caching here).
    block_table: list[int] = field(default_factory=list)
    num_published_blocks: int = 0
    # Across windows.
    previous_token_ids: list[int] = field(default_factory=list)  # the conditioning since the last reset
    finished_text: str = ""  # the finished windows' text
    emitted_text: str = ""  # what the outputs have carried so far
    new_token_ids: list[int] = field(default_factory=list)  # since the last output
    total_prompt_tokens: int = 0
    total_output_tokens: int = 0
    finish_reason: str | None = None

    @property
    def temperature(self) -> float:
        return self.temperatures[len(self.failed_attempts)]

    @property
    def uses_fallback(self) -> bool:
        """Whether the fallback judges each window (a schedule of several temperatures), so
        that a window may be decoded again."""
        return len(self.temperatures) > 1

    @property
    def window_output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]
