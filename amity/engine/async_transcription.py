"""`AsyncEngine` over `WhisperEngine`: the same thread, command batching, streams and
failure handling; what differs is what a request is. `validate` takes the uploaded
bytes: decoding, resampling, VAD and log-mel features all run on a worker thread, off
the event loop and the engine thread."""

import asyncio

from amity.audio.chunking import vad_windows
from amity.audio.decode import AudioDecodeError, decode_audio
from amity.config import EngineConfig
from amity.engine.async_engine import AsyncEngine, _EngineThread
from amity.engine.errors import RequestError
from amity.engine.transcription_request import PreparedTranscription, TranscriptionParams
from amity.engine.whisper_engine import WhisperEngine


class AsyncTranscriptionEngine(AsyncEngine):
    task = "transcribe"

    @classmethod
    async def load(cls, config: EngineConfig) -> "AsyncTranscriptionEngine":
        worker = _EngineThread()
        return cls(await asyncio.wrap_future(worker.submit(WhisperEngine, config)), worker)

    @classmethod
    def from_config(cls, config: EngineConfig) -> "AsyncTranscriptionEngine":
        worker = _EngineThread()
        return cls(worker.submit(WhisperEngine, config).result(), worker)

    @property
    def model_name(self) -> str:
        path = self._core.model_path
        return path.parent.name if path.name == "model" else path.name

    async def validate(self, audio: bytes, params: TranscriptionParams) -> PreparedTranscription:
        return await asyncio.to_thread(self.prepare, audio, params)

    def prepare(self, audio: bytes, params: TranscriptionParams) -> PreparedTranscription:
        try:
            samples = decode_audio(audio)
        except AudioDecodeError as error:
            raise RequestError(str(error), "file") from None
        windows = None  # the whole file
        if params.vad is not None:
            samples, windows = vad_windows(samples, params.vad)
        return self._core.validate(samples, windows, params)
