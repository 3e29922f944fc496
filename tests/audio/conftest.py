"""Real speech made at test time (espeak-ng, then sox to 16 kHz mono), the packaged
Whisper checkpoints, and a real server serving tiny.en."""

import shutil
import subprocess

import httpx
import numpy as np
import pytest

from amity.audio.decode import decode_audio
from amity.config import EngineConfig
from amity.engine.async_transcription import AsyncTranscriptionEngine
from amity.models.packaged_whisper import packaged_whisper_dir
from tests.server.conftest import RunningServer, free_port

SENTENCES = {
    "fox": ("en", "The quick brown fox jumps over the lazy dog. This is a test of speech recognition."),
    "park": ("en", "Yesterday we walked to the park and watched the children play football."),
    "milk": ("en", "Please remember to buy milk and bread on your way home from work."),
    "train": ("en", "The train to London leaves from platform nine at half past seven."),
    "german": ("de", "Guten Morgen. Heute ist das Wetter sehr schön, und wir gehen in den Park."),
}
# The long recording: eight sentences, 0.7 s of silence after each (about 38 s).
LONG_ORDER = ["fox", "park", "milk", "train", "fox", "park", "milk", "train"]


@pytest.fixture(scope="session")
def speech_dir(tmp_path_factory):
    if not (shutil.which("espeak-ng") and shutil.which("sox")):
        pytest.fail("espeak-ng and sox are needed (apt-get install espeak-ng sox; see .ci/run)")
    root = tmp_path_factory.mktemp("speech")
    for name, (voice, text) in SENTENCES.items():
        raw = root / f"{name}-raw.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-w", str(raw), text], check=True)
        subprocess.run(["sox", str(raw), "-r", "16000", "-c", "1", str(root / f"{name}.wav")], check=True)
    return root


def speech_bytes(speech_dir, name: str) -> bytes:
    return (speech_dir / f"{name}.wav").read_bytes()


def speech_samples(speech_dir, name: str) -> np.ndarray:
    return decode_audio(speech_bytes(speech_dir, name))


@pytest.fixture(scope="session")
def long_recording(speech_dir):
    silence = np.zeros(int(0.7 * 16000), np.float32)
    parts = []
    for name in LONG_ORDER:
        parts += [speech_samples(speech_dir, name), silence]
    return np.concatenate(parts)


@pytest.fixture(scope="session")
def tiny_dir():
    return packaged_whisper_dir("whisper-tiny.en")


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory):
    return packaged_whisper_dir("whisper-base", tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def transcription_engine(tiny_dir):
    return AsyncTranscriptionEngine.from_config(EngineConfig(model=str(tiny_dir)))


@pytest.fixture(scope="session")
def audio_server(transcription_engine):
    with RunningServer(transcription_engine, free_port()) as running:
        yield running


@pytest.fixture(scope="session")
def audio_http(audio_server):
    with httpx.Client(base_url=audio_server.url, timeout=300) as client:
        yield client
