"""POST /v1/audio/transcriptions: an audio file in (multipart, the spec's
ContainerAudioTranscriptionBody), its transcript out, whole or streamed.

It streams when `stream` is true, or when `stream` is absent and the `Accept` header
prefers text/event-stream (the friendli SDK's stream call): `transcript.text.delta`
frames as text is decoded, one `transcript.text.done` with the usage, `[DONE]`.

Usage: `audio_tokens` are the encoder positions that hold audio (50 per second, 1500
per full window), `text_tokens` the decoder prompt tokens of every window (task
tokens and the previous window's text), `output_tokens` the generated tokens (each
window's <|endoftext|> included). `processed_audio_length_ms` is the audio the model
heard: all of it without chunking, the speech VAD kept with it.
"""

import json
import math

from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile

from amity.audio.decode import SAMPLE_RATE
from amity.audio.mel import SAMPLES_PER_ENCODER_POSITION
from amity.engine.transcription_request import TranscriptionParams, VadOptions
from amity.server import transcription_schemas as t
from amity.server.errors import error_responses
from amity.server.generation import Generation, start_generation
from amity.server.protocol import InvalidRequest
from amity.server.sse import DONE, SSEResponse, data_frame
from amity.server.state import state_of

router = APIRouter()

# OpenAI's limit for this endpoint; the spec sets none for audio.
MAX_AUDIO_BYTES = 25 * 1024 * 1024
KNOWN_FIELDS = {"file", "model", "language", "temperature", "stream", "chunking_strategy"}


def _text_field(form, name: str) -> str | None:
    value = form.get(name)
    if value is None:
        return None
    if isinstance(value, UploadFile):
        raise InvalidRequest(f"`{name}` must be a form field, not a file", [name])
    return value


def _bool(value: str | None, name: str) -> bool | None:
    if value is None or value.strip().lower() in ("", "null"):
        return None
    text = value.strip().lower()
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    raise InvalidRequest(f"`{name}` must be true or false, not {value!r}", [name])


def _temperature(value: str | None) -> float | None:
    if value is None or value.strip().lower() in ("", "null"):
        return None
    try:
        number = float(value)
    except ValueError:
        raise InvalidRequest(f"`temperature` must be a number, not {value!r}", ["temperature"]) from None
    if not 0.0 <= number <= 1.0:  # also NaN
        raise InvalidRequest(f"`temperature` must be between 0 and 1, not {value}", ["temperature"])
    return number


def _chunking(value: str | None) -> VadOptions | None:
    """None, the string `auto` (plain or JSON-quoted), or a server_vad JSON object."""
    if value is None or value.strip() in ("", "null"):
        return None
    if value.strip() == "auto":
        return VadOptions()
    try:
        spec = json.loads(value)
    except json.JSONDecodeError:
        raise InvalidRequest('`chunking_strategy` must be "auto" or a server_vad object '
                             '({"type": "server_vad", ...})', ["chunking_strategy"]) from None
    if spec is None:
        return None
    if spec == "auto":
        return VadOptions()
    if not isinstance(spec, dict) or spec.get("type") != "server_vad":
        raise InvalidRequest('`chunking_strategy` must be "auto" or an object with "type": "server_vad"',
                             ["chunking_strategy"])
    unknown = set(spec) - {"type", "threshold", "prefix_padding_ms", "silence_duration_ms"}
    if unknown:
        raise InvalidRequest(f"`chunking_strategy` has unknown fields: {', '.join(sorted(unknown))}",
                             ["chunking_strategy"])
    defaults = VadOptions()
    threshold = spec.get("threshold")
    threshold = defaults.threshold if threshold is None else threshold
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise InvalidRequest("`chunking_strategy.threshold` must be a number between 0 and 1",
                             ["chunking_strategy", "threshold"])
    values = {}
    for name in ("prefix_padding_ms", "silence_duration_ms"):
        v = spec.get(name)
        v = getattr(defaults, name) if v is None else v
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10_000:
            raise InvalidRequest(f"`chunking_strategy.{name}` must be an integer from 0 to 10000",
                                 ["chunking_strategy", name])
        values[name] = v
    return VadOptions(threshold=float(threshold), **values)


def _prefers_event_stream(accept: str) -> bool:
    q = {}
    for part in accept.split(","):
        media, *options = [p.strip() for p in part.split(";")]
        weight = 1.0
        for option in options:
            if option.startswith("q="):
                try:
                    weight = float(option[2:])
                except ValueError:
                    weight = 0.0
        q[media.lower()] = weight
    return q.get("text/event-stream", 0.0) > max(q.get("application/json", 0.0), q.get("*/*", 0.0), 0.0)


@router.post("/v1/audio/transcriptions", response_model=t.TranscriptionResult,
             responses=error_responses())
async def transcriptions(request: Request):
    state = state_of(request)
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > MAX_AUDIO_BYTES + 1024 * 1024:
        raise InvalidRequest(f"the request is {int(declared)} bytes; audio files may be at most "
                             f"{MAX_AUDIO_BYTES} bytes (25 MiB)", ["file"])
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise InvalidRequest("send multipart/form-data with the audio in `file`", [])
    form = await request.form(max_files=1, max_fields=len(KNOWN_FIELDS) + 8)
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidRequest("`file` is required: the audio file, as a file part", ["file"])
        audio = await upload.read(MAX_AUDIO_BYTES + 1)
        if len(audio) > MAX_AUDIO_BYTES:
            raise InvalidRequest(f"`file` is over {MAX_AUDIO_BYTES} bytes (25 MiB), the limit", ["file"])
        if not audio:
            raise InvalidRequest("`file` is empty", ["file"])
        language = _text_field(form, "language")
        temperature = _temperature(_text_field(form, "temperature"))
        # Unset: Whisper's fallback from greedy (OpenAI's API does the same for its
        # default). Given: that temperature alone, so 0 is greedy.
        params = TranscriptionParams(language=language.strip() or None if language else None,
                                     temperature=temperature or 0.0, temperature_fallback=temperature is None,
                                     vad=_chunking(_text_field(form, "chunking_strategy")))
        stream = _bool(_text_field(form, "stream"), "stream")
        model = _text_field(form, "model")
    finally:
        await form.close()
    if stream is None:
        stream = _prefers_event_stream(request.headers.get("accept", ""))
    engine = state.resolve_model(model or None)
    gen = await start_generation(request, state, engine, "trsc", [audio], params)
    if stream:
        return SSEResponse(_stream(gen), gen.aclose)
    return await gen.respond(request, _collect(gen))


class _Transcript:
    def __init__(self, gen: Generation):
        self.gen = gen
        self.text = ""

    def usage(self) -> t.TranscriptionUsage:
        prepared = self.gen.prepared[0]
        audio_tokens = sum(math.ceil(n / SAMPLES_PER_ENCODER_POSITION) for n in prepared.window_samples)
        text_tokens = self.gen.counts.prompt_tokens
        output_tokens = self.gen.counts.completion_tokens
        return t.TranscriptionUsage(
            input_tokens=audio_tokens + text_tokens, output_tokens=output_tokens,
            total_tokens=audio_tokens + text_tokens + output_tokens,
            input_audio_length_ms=prepared.input_audio_ms,
            processed_audio_length_ms=round(sum(prepared.window_samples) * 1000 / SAMPLE_RATE),
            input_token_details=t.InputTokenDetails(audio_tokens=audio_tokens, text_tokens=text_tokens))


async def _collect(gen: Generation) -> t.TranscriptionResult:
    transcript = _Transcript(gen)
    async for _, out in gen.outputs():
        transcript.text += out.new_text
    return t.TranscriptionResult(text=transcript.text, usage=transcript.usage())


async def _stream(gen: Generation):
    transcript = _Transcript(gen)
    async for _, out in gen.outputs():
        if out.new_text:
            transcript.text += out.new_text
            yield data_frame(t.TranscriptDelta(delta=out.new_text))
    yield data_frame(t.TranscriptDone(text=transcript.text, usage=transcript.usage()))
    yield DONE
