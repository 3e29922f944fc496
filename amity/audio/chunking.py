"""Where a recording is cut into windows of at most 30 s (Whisper's input).

- No strategy: the whole file as one block, windows back to back. A cut at exactly
  30 s would split a word between two windows (half heard by each: lost or doubled),
  so each window ends at the quietest 20 ms in its last `SEAM_SEARCH_S` seconds.
- VAD (`"auto"`, or `server_vad` with its own settings): loudness normalised first,
  then Silero VAD finds speech; speech segments are merged into windows of at most
  30 s, so every cut falls in a pause, and silence is not transcribed.
"""

import numpy as np

from amity.audio.decode import SAMPLE_RATE
from amity.audio.mel import WINDOW_SAMPLES
from amity.audio.vad import speech_segments
from amity.engine.transcription_request import VadOptions

SEAM_SEARCH_S = 5
FRAME = SAMPLE_RATE // 50  # 20 ms
TARGET_RMS = 0.1  # -20 dBFS: loudness normalisation's target


def back_to_back_windows(samples: np.ndarray) -> list[tuple[int, int]]:
    windows, start = [], 0
    while len(samples) - start > WINDOW_SAMPLES:
        search_from = start + WINDOW_SAMPLES - SEAM_SEARCH_S * SAMPLE_RATE
        frames = samples[search_from:start + WINDOW_SAMPLES]
        energy = (frames[:len(frames) // FRAME * FRAME].reshape(-1, FRAME) ** 2).mean(axis=1)
        # The latest of the quietest frames (ties: keep the window long); cut mid-frame.
        quietest = len(energy) - 1 - int(np.argmin(energy[::-1]))
        end = search_from + quietest * FRAME + FRAME // 2
        windows.append((start, end))
        start = end
    if len(samples) > start:
        windows.append((start, len(samples)))
    return windows


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
