"""Run by tests/suite/test_dedicated_media.py under .venv-sdk012 (friendli==0.12.8)
against a real `amity suite` process whose endpoints are already RUNNING: the dedicated
image, embeddings, classification and transcription operations, through the SDK's own
calls (JSON bodies, the multipart audio body, `audio.stream()`'s Accept header).

Environment: SUITE_URL, SUITE_TOKEN, SD_ENDPOINT, EMBED_ENDPOINT, CLASSIFY_ENDPOINT,
WHISPER_ENDPOINT, SPEECH_WAV (a recording of "Yesterday we walked to the park ...").
"""

import base64
import os
import struct

import pytest
from friendli import SyncFriendli
from friendli.core.utils.retries import RetryConfig

URL, TOKEN = os.environ["SUITE_URL"], os.environ["SUITE_TOKEN"]
SD, EMBED = os.environ["SD_ENDPOINT"], os.environ["EMBED_ENDPOINT"]
CLASSIFY, WHISPER = os.environ["CLASSIFY_ENDPOINT"], os.environ["WHISPER_ENDPOINT"]
NO_RETRIES = RetryConfig("none", None, False)


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return struct.unpack(">II", data[16:24])  # IHDR's width and height


def is_jpeg(data: bytes) -> bool:
    return data.startswith(b"\xff\xd8\xff") and data.endswith(b"\xff\xd9")


@pytest.fixture(scope="module")
def dedicated():
    with SyncFriendli(token=TOKEN, server_url=URL, retry_config=NO_RETRIES,
                      timeout_ms=600_000) as client:
        yield client.dedicated


def _png(dedicated, seed: int) -> bytes:
    result = dedicated.image.generate(model=SD, prompt="a red square", num_inference_steps=2,
                                      seed=seed, response_format="png")
    [item] = result.data
    assert (item.seed, item.response_format) == (seed, "png")
    return base64.b64decode(item.b64_json)


def test_images(dedicated):
    first = _png(dedicated, 7)
    assert png_size(first) == (32, 32)
    assert _png(dedicated, 7) == first and _png(dedicated, 8) != first
    [item] = dedicated.image.generate(model=SD, prompt="a red square", num_inference_steps=2).data
    assert item.response_format == "url" and item.url.startswith("data:image/jpeg;base64,")
    assert is_jpeg(base64.b64decode(item.url.split(",", 1)[1]))
    source = "data:image/png;base64," + base64.b64encode(first).decode()
    [edited] = dedicated.image.edit(model=SD, prompt="a blue square", image={"image": source},
                                    num_inference_steps=2, seed=3, response_format="jpeg").data
    assert (edited.seed, edited.response_format) == (3, "jpeg")
    assert is_jpeg(base64.b64decode(edited.b64_json))


def test_embeddings_and_classification(dedicated):
    result = dedicated.embeddings.embeddings(model=EMBED, input_=["the fox", "a dog"])
    assert result.model == EMBED and len(result.data) == 2
    assert len(result.data[0].embedding) == 64 and result.data[0].embedding != result.data[1].embedding
    labels = dedicated.classification.classify(model=CLASSIFY, input_="I am very angry")
    [row] = labels.data
    assert row.label in ("negative", "neutral", "positive") and len(row.probs) == 3


def test_transcription(dedicated):
    audio = open(os.environ["SPEECH_WAV"], "rb").read()
    result = dedicated.audio.transcribe(model=WHISPER, file={"file_name": "park.wav", "content": audio})
    assert "park" in result.text and "children" in result.text
    # stream() sends no `stream` field, only Accept: text/event-stream
    events = [e.data for e in dedicated.audio.stream(
        model=WHISPER, file={"file_name": "park.wav", "content": audio})]
    deltas = "".join(e.delta for e in events if e.type == "transcript.text.delta")
    done = [e for e in events if e.type == "transcript.text.done"]
    assert len(done) == 1 and deltas == done[0].text == result.text
