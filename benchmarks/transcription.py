"""Audio seconds transcribed per wall second: amity over HTTP (`amity serve`, as it
serves by default and with `--dtype float32`) at concurrency 1 and 8, beside
faster-whisper (same CTranslate2 files, int8 and float32; its batched pipeline for the
c=8 row; greedy: temperature 0, no fallback, as amity is asked for; only when
`faster-whisper` is installed) and transformers' ASR pipeline (on
the same weights, converted as the parity tests do; 30 s chunks, `batch_size` = the
concurrency, as faster-whisper's batched pipeline batches one file's segments),
greedy, English, on clips of about 20-60 s of espeak-ng speech (transformers' pipeline on
the first `--transformers-clips` only: it runs at under 1 audio s per wall s here, and
all eight would take 20 minutes). Each round runs every system at c=1 and c=8 in turn (amity's servers start once and wait idle between
turns); the table gives each row's median over the rounds and the word error rate of
its text against the sentences spoken. `--baseline CHECKOUT` serves that checkout's amity
too (e.g. main, for before/after in one run).

    TORCH_EXTENSIONS_DIR=/work/ext PYTHONPATH=. /work/main/.venv/bin/python \
        benchmarks/transcription.py --model whisper-tiny.en --clips 8 --rounds 1
"""

import argparse
import concurrent.futures
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import httpx
import numpy as np

from amity.audio.decode import decode_audio
from amity.models.packaged_whisper import packaged_whisper_dir
from amity.models.whisper_loader import model_bin_parts

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Yesterday we walked to the park and watched the children play football.",
    "Please remember to buy milk and bread on your way home from work.",
    "The train to London leaves from platform nine at half past seven.",
    "This is a test of speech recognition on a shared machine.",
]


def make_clips(count: int, seed: int = 0) -> tuple[list[np.ndarray], list[str]]:
    """`count` clips of 20-60 s (sentences with 0.5 s pauses) and the text of each."""
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as tmp:
        pieces = []
        for i, text in enumerate(SENTENCES):
            path = os.path.join(tmp, f"{i}.wav")
            subprocess.run(["espeak-ng", "-w", path + ".raw.wav", text], check=True)
            subprocess.run(["sox", path + ".raw.wav", "-r", "16000", "-c", "1", path], check=True)
            with open(path, "rb") as f:
                pieces.append(decode_audio(f.read()))
    clips, texts, pause = [], [], np.zeros(8000, np.float32)
    for _ in range(count):
        target = rng.uniform(20, 60) * 16000
        parts, spoken = [], []
        while sum(len(p) for p in parts) < target:
            k = rng.integers(len(pieces))
            parts += [pieces[k], pause]
            spoken.append(SENTENCES[k])
        clips.append(np.concatenate(parts))
        texts.append(" ".join(spoken))
    return clips, texts


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """Word-level edit distance over the reference words, all clips together
    (lower case, punctuation dropped; "nine" and "9" count as different words)."""
    def words(text: str) -> list[str]:
        return "".join(c if c.isalnum() or c.isspace() else " " for c in text.lower()).split()

    errors = total = 0
    for reference, hypothesis in zip(references, hypotheses):
        ref, hyp = words(reference), words(hypothesis)
        row = list(range(len(hyp) + 1))
        for i, r in enumerate(ref, 1):
            previous, row[0] = row[0], i
            for j, h in enumerate(hyp, 1):
                previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
        errors += row[-1]
        total += len(ref)
    return errors / total


def wav_bytes(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
        w.writeframes((np.clip(samples, -1, 1) * 32767).astype(np.int16).tobytes())
    return buffer.getvalue()


class AmityServer:
    """`amity serve` on a free port, up and warmed by one short request."""

    def __init__(self, model: str, extra_args: list[str], pythonpath: str | None = None):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "amity.cli", "serve", "--model", model, "--port", str(port), *extra_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None,
            cwd=pythonpath)  # `-m` puts the working directory first on sys.path
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"amity serve {' '.join(extra_args)} exited with {self.process.returncode}")
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.transcribe(wav_bytes(np.zeros(32000, np.float32)))  # warm-up

    def transcribe(self, body: bytes) -> str:
        r = httpx.post(self.url + "/v1/audio/transcriptions", files={"file": ("a.wav", body)},
                       data={"language": "en", "temperature": "0"}, timeout=3600)  # greedy, no fallback
        r.raise_for_status()
        return r.json()["text"]

    def run(self, clips, concurrency: int) -> list[str]:
        bodies = [wav_bytes(c) for c in clips]
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(self.transcribe, bodies))

    def close(self) -> None:
        self.process.terminate()
        self.process.wait()


def ctranslate2_dir(model: str, scratch: str) -> Path:
    """The packaged directory, or for a split model.bin (whisper-base) a copy in
    `scratch` with the parts joined: ctranslate2 reads only a whole model.bin."""
    source = packaged_whisper_dir(model)
    parts = model_bin_parts(source)
    if [p.name for p in parts] == ["model.bin"]:
        return source
    target = Path(scratch) / model
    target.mkdir(exist_ok=True)
    for f in source.iterdir():
        if not f.name.startswith("model.bin") and not (target / f.name).exists():
            (target / f.name).symlink_to(f.resolve())
    if not (target / "model.bin").exists():
        with open(target / "model.bin", "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)
    return target


def faster_whisper_runner(model: str, compute_type: str, scratch: str):
    from faster_whisper import BatchedInferencePipeline, WhisperModel

    fw = WhisperModel(str(ctranslate2_dir(model, scratch)), device="cpu", compute_type=compute_type)
    batched = BatchedInferencePipeline(fw)

    def run(clips, concurrency: int) -> list[str]:
        texts = []
        for clip in clips:
            if concurrency == 1:
                segments, _ = fw.transcribe(clip, beam_size=1, temperature=0.0, language="en")
            else:
                segments, _ = batched.transcribe(clip, beam_size=1, temperature=0.0, language="en",
                                                 batch_size=concurrency)
            texts.append("".join(s.text for s in segments))
        return texts
    return run


def transformers_runner(model: str):
    from transformers import WhisperFeatureExtractor, WhisperTokenizerFast, pipeline

    from amity.models.whisper_loader import load_whisper
    from tests.audio.test_whisper_parity import reference

    loaded = load_whisper(packaged_whisper_dir(model))
    asr = pipeline("automatic-speech-recognition", model=reference(loaded), device="cpu",
                   tokenizer=WhisperTokenizerFast(tokenizer_file=str(loaded.path / "tokenizer.json"),
                                                  pad_token="<|endoftext|>"),
                   feature_extractor=WhisperFeatureExtractor(feature_size=loaded.model.dims.num_mel_bins))
    language = {"language": "en", "task": "transcribe"} if loaded.vocab.is_multilingual else {}

    def run(clips, concurrency: int) -> list[str]:
        return [asr(clip, chunk_length_s=30, batch_size=concurrency,
                    generate_kwargs={"num_beams": 1, **language})["text"] for clip in clips]
    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="whisper-tiny.en", choices=("whisper-tiny.en", "whisper-base"))
    parser.add_argument("--clips", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--transformers-clips", type=int, default=1, help="0 leaves its row out")
    parser.add_argument("--baseline", metavar="CHECKOUT",
                        help="also serve another checkout's amity (its default precision), e.g. main's")
    args = parser.parse_args()
    clips, spoken = make_clips(args.clips)
    audio_s = sum(len(c) for c in clips) / 16000
    print(f"{args.model}: {len(clips)} clips, {audio_s:.0f} s of audio; {os.cpu_count()} CPUs", flush=True)
    scratch = tempfile.TemporaryDirectory()
    servers = {"amity (default)": AmityServer(args.model, []),
               "amity --dtype float32": AmityServer(args.model, ["--dtype", "float32"])}
    if args.baseline:
        servers[f"amity {Path(args.baseline).name} (default)"] = AmityServer(args.model, [], args.baseline)
    try:
        systems = {name: server.run for name, server in servers.items()}
        try:
            for compute_type in ("int8", "float32"):
                systems[f"faster-whisper {compute_type}"] = faster_whisper_runner(args.model, compute_type,
                                                                                  scratch.name)
        except ImportError:
            print("faster-whisper is not installed: its rows are left out")
        subset = slice(0, args.transformers_clips)
        if args.transformers_clips > 0:  # 0: its row is left out
            systems[f"transformers pipeline ({args.transformers_clips} clip(s))"] = transformers_runner(args.model)
        speeds: dict[tuple[str, int], list[float]] = {}
        errors: dict[tuple[str, int], float] = {}
        for round_ in range(args.rounds):
            for concurrency in (1, 8):
                for name, run in systems.items():
                    part = subset if name.startswith("transformers") else slice(None)
                    start = time.perf_counter()
                    texts = run(clips[part], concurrency)
                    speed = sum(len(c) for c in clips[part]) / 16000 / (time.perf_counter() - start)
                    speeds.setdefault((name, concurrency), []).append(speed)
                    errors[name, concurrency] = word_error_rate(spoken[part], texts)
                    print(f"round {round_ + 1} c={concurrency} {name}: {speed:.2f} audio s per wall s, "
                          f"WER {errors[name, concurrency]:.3f} (load average {os.getloadavg()[0]:.1f})",
                          flush=True)
    finally:
        for server in servers.values():
            server.close()
        scratch.cleanup()
    median = {key: float(np.median(values)) for key, values in speeds.items()}
    print(f"\n| audio s per wall s (median of {args.rounds}) | c=1 | c=8 | WER c=1 | WER c=8 |")
    print("|---|---|---|---|---|")
    for name in systems:
        print(f"| {name} | {median[name, 1]:.2f} | {median[name, 8]:.2f} | "
              f"{errors[name, 1]:.3f} | {errors[name, 8]:.3f} |")
    peers = [name for name in systems if name.startswith("faster-whisper")]
    if peers:
        for concurrency in (1, 8):
            best = max(peers, key=lambda name: median[name, concurrency])
            print(f"c={concurrency}: amity (default) / {best} = "
                  f"{median['amity (default)', concurrency] / median[best, concurrency]:.2f}x")


if __name__ == "__main__":
    main()
