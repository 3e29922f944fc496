"""Wire models of POST /v1/audio/transcriptions (the spec's AudioTranscriptionResult
and StreamedAudioTranscriptionResult). The request is multipart, parsed in the route."""

from typing import Literal

from pydantic import BaseModel


class InputTokenDetails(BaseModel):
    audio_tokens: int
    text_tokens: int


class TranscriptionUsage(BaseModel):
    type: Literal["tokens"] = "tokens"
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_audio_length_ms: int
    processed_audio_length_ms: int
    input_token_details: InputTokenDetails


class TranscriptionResult(BaseModel):
    text: str
    usage: TranscriptionUsage


class TranscriptDelta(BaseModel):
    type: Literal["transcript.text.delta"] = "transcript.text.delta"
    delta: str


class TranscriptDone(BaseModel):
    type: Literal["transcript.text.done"] = "transcript.text.done"
    text: str
    usage: TranscriptionUsage
