"""The transcription engine on tiny.en: long recordings across window seams, VAD
chunking, and batching that changes nothing."""

import numpy as np
import pytest
import torch

from amity.audio.chunking import back_to_back_windows, vad_windows
from amity.audio.mel import WINDOW_SAMPLES
from amity.config import EngineConfig
from amity.engine.transcription_request import TranscriptionParams, VadOptions
from amity.engine.whisper_engine import WhisperEngine
from amity.models.cpu_kernels import cpu_has
from amity.models.whisper_compute import prepare_whisper
from tests.audio.conftest import speech_samples

pytestmark = pytest.mark.slow

KEYWORDS = {"fox": "lazy", "park": "football", "milk": "milk", "train": "London"}
ORDER = ["fox", "park", "milk", "train", "fox", "park", "milk", "train"]


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    """The float32 reference path."""
    return WhisperEngine(EngineConfig(model=str(tiny_dir), dtype="float32", max_num_seqs=8))


@pytest.fixture(scope="module")
def tiny_default(tiny_dir):
    """As served: bfloat16 encoder and LM head where the CPU has AVX512-BF16."""
    return WhisperEngine(EngineConfig(model=str(tiny_dir), max_num_seqs=8))


def test_default_precision(tiny, tiny_default):
    assert tiny.precision == "float32"
    assert tiny_default.precision == ("bf16" if cpu_has("avx512_bf16") else "float32")
    assert tiny_default.model.encoder_autocast == (torch.bfloat16 if tiny_default.precision == "bf16" else None)
    with pytest.raises(ValueError, match="already computes"):  # one loaded model, one precision
        prepare_whisper(tiny.model, "bf16")


@pytest.fixture(scope="module")
def long_recording(speech_dir):
    """About 45 s: eight sentences, 0.7 s of silence after each."""
    silence = np.zeros(int(0.7 * 16000), np.float32)
    parts = []
    for name in ORDER:
        parts += [speech_samples(speech_dir, name), silence]
    return np.concatenate(parts)


def _text(final) -> str:
    return final.ordered_choices[0].text


def test_windows_cut_in_quiet(long_recording):
    windows = back_to_back_windows(long_recording)
    assert len(windows) == 2 and windows[0][0] == 0 and windows[-1][1] == len(long_recording)
    assert windows[0][1] == windows[1][0] and windows[0][1] - windows[0][0] <= WINDOW_SAMPLES
    cut = windows[0][1]
    assert np.abs(long_recording[cut - 160:cut + 160]).max() < 1e-3  # in a pause, not in a word


@pytest.mark.parametrize("engine", ["tiny", "tiny_default"])
def test_long_audio_transcribes_completely(engine, request, long_recording):
    (final,) = request.getfixturevalue(engine).transcribe([(long_recording, back_to_back_windows(long_recording), TranscriptionParams())])
    text = _text(final)
    for name, keyword in KEYWORDS.items():
        assert text.count(keyword) == ORDER.count(name), (keyword, text)


def test_vad_cuts_in_silence(tiny, long_recording):
    # 3 s of silence up front and in the middle: VAD leaves them out.
    gap = np.zeros(3 * 16000, np.float32)
    audio = np.concatenate([gap, long_recording[:len(long_recording) // 2], gap,
                            long_recording[len(long_recording) // 2:]]) * 0.05  # quiet: normalised
    samples, windows = vad_windows(audio, VadOptions())
    assert len(windows) >= 2 and all(b - a <= WINDOW_SAMPLES for a, b in windows)
    assert windows[0][0] >= 2.5 * 16000  # the leading silence is skipped
    assert sum(b - a for a, b in windows) < len(audio) - 2.5 * 16000  # pauses inside a window stay
    for a, b in windows:  # every cut falls where the signal is quiet
        for edge in (a, b):
            assert np.abs(samples[max(0, edge - 80):edge + 80]).max() < 0.05
    (final,) = tiny.transcribe([(samples, windows, TranscriptionParams())])
    for name, keyword in KEYWORDS.items():
        assert _text(final).count(keyword) == ORDER.count(name), _text(final)


@pytest.mark.parametrize("engine", ["tiny", "tiny_default"])
def test_batched_equals_solo(engine, request, speech_dir, long_recording):
    """In float32 by design (our kernels sum in a fixed order at every batch size);
    in bfloat16 too on this model and these clips (oneDNN's encoder gives a window
    the same numbers alone as in a batch of windows)."""
    tiny = request.getfixturevalue(engine)
    clips = [speech_samples(speech_dir, name) for name in ("fox", "park", "milk", "train")] + [long_recording]
    items = [(s, back_to_back_windows(s), TranscriptionParams()) for s in clips]
    solo = [tiny.transcribe([item])[0].ordered_choices[0].token_ids for item in items]
    together = [f.ordered_choices[0].token_ids for f in tiny.transcribe(items)]
    assert together == solo


def test_silence_only_is_empty_under_vad(tiny):
    samples, windows = vad_windows(np.zeros(5 * 16000, np.float32), VadOptions())
    assert windows == []
    (final,) = tiny.transcribe([(samples, windows, TranscriptionParams())])
    assert _text(final) == "" and final.finished
