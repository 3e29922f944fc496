"""Where VAD chunking cuts a recording into windows of at most 30 s (Whisper's input).

With no strategy nothing is cut here: the engine reads the whole file as Whisper does,
each window starting where the last one's complete segments end (whisper_timestamps.py).
VAD (`"auto"`, or `server_vad` with its own settings): loudness normalised first, then
Silero VAD finds speech; speech segments are merged into windows of at most 30 s, so
every cut falls in a pause, and silence is not transcribed.
"""

import numpy as np

from amity.audio.decode import SAMPLE_RATE
from amity.audio.mel import WINDOW_SAMPLES
from amity.audio.vad import speech_segments
from amity.engine.transcription_request import VadOptions

FRAME = SAMPLE_RATE // 50  # 20 ms
TARGET_RMS = 0.1  # -20 dBFS: loudness normalisation's target


def normalise_loudness(samples: np.ndarray) -> np.ndarray:
    """Scale to TARGET_RMS (measured over the louder half of 20 ms frames, so long
    silences do not inflate the gain), never past a peak of 1."""
    frames = samples[:len(samples) // FRAME * FRAME].reshape(-1, FRAME)
    if frames.size == 0:
        return samples
    rms = np.sqrt((frames ** 2).mean(axis=1))
    loud = rms[rms >= np.median(rms)]
    level = float(np.sqrt((loud ** 2).mean())) if loud.size else 0.0
    peak = float(np.abs(samples).max())
    if level < 1e-6 or peak == 0:
        return samples
    gain = min(TARGET_RMS / level, 1.0 / peak)
    return (samples * gain).astype(np.float32)


def vad_windows(samples: np.ndarray, options: VadOptions) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The normalised samples and the windows of speech in them."""
    samples = normalise_loudness(samples)
    pad = options.prefix_padding_ms * SAMPLE_RATE // 1000
    segments = speech_segments(samples, options.threshold, options.silence_duration_ms,
                               speech_pad_ms=min(options.prefix_padding_ms, 30_000),
                               max_speech_s=(WINDOW_SAMPLES - 2 * pad) / SAMPLE_RATE - 0.1)
    windows: list[tuple[int, int]] = []
    for start, end in segments:
        if windows and end - windows[-1][0] <= WINDOW_SAMPLES:
            windows[-1] = (windows[-1][0], end)  # merge: still fits one window
        else:
            windows.append((start, end))
    return samples, windows
