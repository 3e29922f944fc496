"""Whisper's log-mel spectrogram, as `transformers`' WhisperFeatureExtractor makes it:
the audio zero-padded (or cut) to 30 s, a 400-point STFT with a periodic Hann window
every 160 samples, power, Slaney mel filters to 0-8 kHz, log10, floored at 8 below the
maximum, then (x + 4) / 4."""

from functools import lru_cache

import numpy as np
import torch

from amity.audio.decode import SAMPLE_RATE

N_FFT = 400
HOP_LENGTH = 160
WINDOW_SECONDS = 30
WINDOW_SAMPLES = WINDOW_SECONDS * SAMPLE_RATE
WINDOW_FRAMES = WINDOW_SAMPLES // HOP_LENGTH  # 3000
SAMPLES_PER_ENCODER_POSITION = 2 * HOP_LENGTH  # conv2 halves the frames: 20 ms each


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    mel = hz / (200.0 / 3)
    log_region = hz >= 1000.0
    mel[log_region] = 15.0 + np.log(hz[log_region] / 1000.0) / (np.log(6.4) / 27.0)
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = mel * (200.0 / 3)
    log_region = mel >= 15.0
    hz[log_region] = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel[log_region] - 15.0))
    return hz


@lru_cache(maxsize=4)
def mel_filters(num_mel_bins: int) -> torch.Tensor:
    """[num_mel_bins, N_FFT // 2 + 1] triangular Slaney filters, area-normalised."""
    fft_hz = np.linspace(0, SAMPLE_RATE // 2, N_FFT // 2 + 1)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array([0.0]))[0],
                                   _hz_to_mel(np.array([8000.0]))[0], num_mel_bins + 2))
    slopes = edges[None, :] - fft_hz[:, None]
    widths = np.diff(edges)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    filters *= 2.0 / (edges[2:num_mel_bins + 2] - edges[:num_mel_bins])
    return torch.from_numpy(filters.T.astype(np.float32))


def log_mel(samples: np.ndarray, num_mel_bins: int = 80, whole: bool = False) -> torch.Tensor:
    """16 kHz samples -> [num_mel_bins, 3000] features of the first 30 s, the audio
    zero-padded to 30 s; `whole`: the whole recording unpadded -> [num_mel_bins,
    len // 160], as transformers' extractor makes long-form features (`truncation=False,
    padding="longest"`; the floor at 8 below the maximum is then the recording's)."""
    if whole:
        audio = torch.from_numpy(np.asarray(samples, dtype=np.float32))
    else:
        audio = torch.zeros(WINDOW_SAMPLES)
        clip = torch.from_numpy(np.asarray(samples[:WINDOW_SAMPLES], dtype=np.float32))
        audio[:len(clip)] = clip
    stft = torch.stft(audio, N_FFT, HOP_LENGTH, window=torch.hann_window(N_FFT), return_complex=True)
    power = stft[..., :-1].abs() ** 2
    log_spec = (mel_filters(num_mel_bins) @ power).clamp(min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0
