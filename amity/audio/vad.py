"""Voice activity detection with Silero VAD (v6, the TorchScript model the `silero-vad`
package ships) and that package's own segmentation (`get_speech_timestamps`)."""

import threading
from functools import lru_cache
from importlib.resources import files

import numpy as np
import torch

from amity.audio.decode import SAMPLE_RATE

_lock = threading.Lock()  # the model keeps state between calls: one user at a time


@lru_cache(maxsize=1)
def _model():
    model = torch.jit.load(str(files("silero_vad") / "data" / "silero_vad.jit"), map_location="cpu")
    return model.eval()


def speech_segments(samples: np.ndarray, threshold: float, min_silence_ms: int,
                    speech_pad_ms: int, max_speech_s: float) -> list[tuple[int, int]]:
    """[start, end) sample ranges of speech, each at most `max_speech_s` long (split at
    the longest silence inside when longer)."""
    from silero_vad.utils_vad import get_speech_timestamps  # torch-only; imported on first use
    with _lock, torch.inference_mode():
        stamps = get_speech_timestamps(
            torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32)), _model(),
            threshold=threshold, sampling_rate=SAMPLE_RATE, min_silence_duration_ms=min_silence_ms,
            speech_pad_ms=speech_pad_ms, max_speech_duration_s=max_speech_s)
    return [(int(s["start"]), int(s["end"])) for s in stamps]
