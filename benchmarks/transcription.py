"""Audio seconds transcribed per wall second: amity over HTTP (`amity serve`) at
concurrency 1 and 8, beside faster-whisper (same CTranslate2 files; only when
`faster-whisper` is installed) and transformers' ASR pipeline (on the same weights,
converted as the parity tests do; 30 s chunks, `batch_size` = the concurrency, as
faster-whisper's batched pipeline batches one file's segments), greedy, English, on
clips of about 20-60 s of espeak-ng speech.

    PYTHONPATH=. .venv/bin/python benchmarks/transcription.py --model whisper-tiny.en --clips 8
"""

import argparse
import concurrent.futures
import io
import os
import socket
import subprocess
import sys
import tempfile
import time
import wave

import httpx
import numpy as np

from amity.audio.decode import decode_audio
from amity.models.packaged_whisper import packaged_whisper_dir

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Yesterday we walked to the park and watched the children play football.",
    "Please remember to buy milk and bread on your way home from work.",
    "The train to London leaves from platform nine at half past seven.",
    "This is a test of speech recognition on a shared machine.",
]


def make_clips(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        pieces = []
        for i, text in enumerate(SENTENCES):
            path = os.path.join(tmp, f"{i}.wav")
            subprocess.run(["espeak-ng", "-w", path + ".raw.wav", text], check=True)
            subprocess.run(["sox", path + ".raw.wav", "-r", "16000", "-c", "1", path], check=True)
            with open(path, "rb") as f:
                pieces.append(decode_audio(f.read()))
    clips, pause = [], np.zeros(8000, np.float32)
    for _ in range(count):
        target = rng.uniform(20, 60) * 16000
        parts = []
        while sum(len(p) for p in parts) < target:
            parts += [pieces[rng.integers(len(pieces))], pause]
        clips.append(np.concatenate(parts))
    return clips


def wav_bytes(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())
    return buffer.getvalue()


def bench_amity(model: str, clips, concurrency: int) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "amity.cli", "serve", "--model", model, "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        bodies = [wav_bytes(c) for c in clips]

        def one(body: bytes) -> str:
            r = httpx.post(url + "/v1/audio/transcriptions", files={"file": ("a.wav", body)},
                           data={"language": "en"}, timeout=3600)
            r.raise_for_status()
            return r.json()["text"]

        one(bodies[0][:16000 * 2 * 2 + 44])  # warm-up
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(one, bodies))
        return time.perf_counter() - start
    finally:
        server.terminate()
        server.wait()


def bench_faster_whisper(model: str, clips, concurrency: int, compute_type: str) -> float | None:
    try:
        from faster_whisper import BatchedInferencePipeline, WhisperModel
    except ImportError:
        return None
    fw = WhisperModel(str(packaged_whisper_dir(model)), device="cpu", compute_type=compute_type)
    start = time.perf_counter()
    for clip in clips:
        if concurrency == 1:
            segments, _ = fw.transcribe(clip, beam_size=1, language="en")
        else:
            segments, _ = BatchedInferencePipeline(fw).transcribe(clip, beam_size=1, language="en",
                                                                  batch_size=concurrency)
        "".join(s.text for s in segments)
    return time.perf_counter() - start


def bench_transformers(model: str, clips, concurrency: int) -> float:
    from transformers import WhisperFeatureExtractor, WhisperTokenizerFast, pipeline

    from amity.models.whisper_loader import load_whisper
    from tests.audio.test_whisper_parity import reference

    loaded = load_whisper(packaged_whisper_dir(model))
    asr = pipeline("automatic-speech-recognition", model=reference(loaded), device="cpu",
                   tokenizer=WhisperTokenizerFast(tokenizer_file=str(loaded.path / "tokenizer.json"),
                                                  pad_token="<|endoftext|>"),
                   feature_extractor=WhisperFeatureExtractor(feature_size=loaded.model.dims.num_mel_bins))
    language = {"language": "en", "task": "transcribe"} if loaded.vocab.is_multilingual else {}
    start = time.perf_counter()
    for clip in clips:
        asr(clip, chunk_length_s=30, batch_size=concurrency, generate_kwargs={"num_beams": 1, **language})
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="whisper-tiny.en", choices=("whisper-tiny.en", "whisper-base"))
    parser.add_argument("--clips", type=int, default=8)
    args = parser.parse_args()
    clips = make_clips(args.clips)
    audio_s = sum(len(c) for c in clips) / 16000
    print(f"{args.model}: {len(clips)} clips, {audio_s:.0f} s of audio")
    for c in (1, 8):
        wall = bench_amity(args.model, clips, c)
        print(f"amity c={c}: {audio_s / wall:.2f} audio s per wall s (load average {os.getloadavg()[0]:.1f})",
              flush=True)
        for compute_type in ("int8", "float32"):
            wall = bench_faster_whisper(args.model, clips, c, compute_type)
            if wall is not None:
                print(f"faster-whisper {compute_type} c={c}: {audio_s / wall:.2f} audio s per wall s",
                      flush=True)
        wall = bench_transformers(args.model, clips, c)
        print(f"transformers pipeline c={c}: {audio_s / wall:.2f} audio s per wall s", flush=True)


if __name__ == "__main__":
    main()
