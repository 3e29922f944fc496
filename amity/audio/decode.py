"""Any common audio file (wav, flac, mp3, ogg/opus, webm, m4a, ...) -> 16 kHz mono
float32 samples, through PyAV (FFmpeg's demuxers, decoders and resampler)."""

import io

import av
import numpy as np

SAMPLE_RATE = 16000


class AudioDecodeError(ValueError):
    """The bytes are not audio PyAV can decode (or hold no audio at all)."""


def decode_audio(data: bytes) -> np.ndarray:
    """The first audio stream of `data`, downmixed and resampled to 16 kHz, in [-1, 1]."""
    if not data:
        raise AudioDecodeError("the file is empty")
    chunks: list[np.ndarray] = []
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                raise AudioDecodeError("the file has no audio stream")
            stream = container.streams.audio[0]
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
            for frame in container.decode(stream):
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
            for out in resampler.resample(None):  # flush
                chunks.append(out.to_ndarray().reshape(-1))
    except AudioDecodeError:
        raise
    except (av.FFmpegError, ValueError, EOFError, IndexError) as error:
        raise AudioDecodeError(f"the file is not audio this server can decode ({error})") from None
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    if samples.size == 0:
        raise AudioDecodeError("the file holds no audio samples")
    return samples.astype(np.float32, copy=False)
