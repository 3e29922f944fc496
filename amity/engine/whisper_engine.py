"""The transcription engine core: Whisper requests, batched step by step.

Driven like `LLMEngine` (by `AsyncEngine`'s thread, or `transcribe` offline): add
requests, `step()`, read `RequestOutput` deltas. A step:

1. encodes the next window of waiting requests (FIFO; one window while others are
   decoding, so a long recording's next window costs the others one encoder pass,
   more at once when nothing decodes), computing each window's cross-attention K/V
   once and keeping them with the request until the window ends; a window is admitted
   only when the KV pool can hold a whole window (448 decoder tokens), so nothing is
   ever preempted;
2. runs one decoder pass over every decoding request together (prompts in chunks
   under `max_num_batched_tokens`, then one token each), self-attention K/V in the
   paged KV cache;
3. picks each next token as `transformers`' Whisper generation does: suppress tokens,
   begin-suppress tokens at a window's first output, greedy at temperature 0;
4. ends a window at <|endoftext|> (or at 448 tokens), frees its blocks and queues the
   request's next window behind the others (windows are scheduled like chunks).
"""

import collections
import logging
import random
import time

import numpy as np
import torch

from amity.audio.mel import log_mel
from amity.config import EngineConfig, parse_memory
from amity.engine.errors import RequestError
from amity.engine.kv_cache_manager import KVCacheManager
from amity.engine.outputs import CompletionOutput, FinalOutput, RequestOutput
from amity.engine.transcription_request import (MAX_PREVIOUS_TOKENS, Phase, PreparedTranscription,
                                                TranscriptionParams, TranscriptionRequest)
from amity.models.attention import AttentionMetadata
from amity.models.dtype import prepare_device
from amity.models.whisper_compute import default_precision, prepare_whisper
from amity.models.whisper_loader import LoadedWhisper, load_whisper

logger = logging.getLogger("amity.engine")

# Windows encoded in one step while other requests decode (they wait for it).
ENCODE_BATCH_WHILE_DECODING = 1
ENCODE_BATCH_IDLE = 8


class WhisperEngine:
    is_encoder_decoder = True
    task = "transcribe"

    def __init__(self, config: EngineConfig, loaded: LoadedWhisper | None = None):
        self.config = config
        self.device, self.dtype = prepare_device(config.device, config.dtype, config.num_threads)
        loaded = loaded or load_whisper(config.model, self.dtype, self.device)
        self.model, self.tokenizer, self.vocab = loaded.model, loaded.tokenizer, loaded.vocab
        self.precision = None  # torch's own kernels as loaded (a GPU, or bfloat16 weights)
        if self.device.type == "cpu" and self.dtype == torch.float32:
            self.precision = default_precision(config.dtype, self.device)
            prepare_whisper(self.model, self.precision)
        self.model_path = loaded.path
        dims = self.model.dims
        self.vocab_size = dims.vocab_size
        self.max_model_len = dims.max_target_positions  # decoder tokens per window
        self.block_size = config.block_size
        self.blocks_per_window = -(-self.max_model_len // self.block_size)
        head_dim = dims.d_model // dims.decoder_heads
        bytes_per_block = 2 * dims.decoder_layers * self.block_size * dims.d_model * self.dtype.itemsize
        budget_blocks = parse_memory(config.kv_cache_memory, _free_bytes()) // bytes_per_block
        self.num_blocks = max(self.blocks_per_window,
                              min(budget_blocks, config.max_num_seqs * self.blocks_per_window))
        shape = (self.num_blocks, self.block_size, dims.decoder_heads, head_dim)
        self.kv_caches = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                           torch.zeros(shape, dtype=self.dtype, device=self.device))
                          for _ in range(dims.decoder_layers)]
        self.kv = KVCacheManager(self.num_blocks, self.block_size, enable_prefix_caching=False)
        self.requests: dict[str, TranscriptionRequest] = {}
        self.encode_queue: collections.deque[TranscriptionRequest] = collections.deque()
        self.decoding: list[TranscriptionRequest] = []
        self.finished_unreported: list[TranscriptionRequest] = []
        self.suppress = self._mask(self.vocab.suppress_ids)
        self.begin_suppress = self._mask(self.vocab.begin_suppress_ids)
        self.language_mask = ~self._mask(self.vocab.language_ids.values())
        self.num_steps = 0
        self.last_step_scheduled = False
        logger.info("transcription engine: %s on %s (%s, compute %s), %d KV blocks of %d tokens (%d windows)",
                    self.model_path, self.device, self.dtype, self.precision, self.num_blocks, self.block_size,
                    self.num_blocks // self.blocks_per_window)

    def _mask(self, token_ids) -> torch.Tensor:
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[[t for t in token_ids if t < self.vocab_size]] = True
        return mask

    # -- requests -----------------------------------------------------------

    def validate(self, samples: np.ndarray, windows: list[tuple[int, int]],
                 params: TranscriptionParams) -> PreparedTranscription:
        """`windows`: [start, end) sample ranges of at most 30 s each. Computes the
        log-mel features; safe on any thread."""
        if not 0.0 <= params.temperature <= 1.0:
            raise RequestError(f"`temperature` must be between 0 and 1, not {params.temperature}",
                               "temperature")
        if params.task not in ("transcribe", "translate"):
            raise RequestError("`task` must be transcribe or translate", "task")
        language_id = None
        if params.language is not None:
            code = params.language.strip().lower()
            if self.vocab.is_multilingual:
                if code not in self.vocab.language_ids:
                    raise RequestError(f"`language` {params.language!r} is not an ISO-639-1 code this "
                                       "model knows (e.g. en, de, fr)", "language")
                language_id = self.vocab.language_ids[code]
            elif code != "en":
                raise RequestError(f"this model transcribes English only; `language` "
                                   f"{params.language!r} is not supported", "language")
        if not self.vocab.is_multilingual and params.task != "transcribe":
            raise RequestError("this model transcribes English only; it cannot translate", "task")
        features = [log_mel(samples[a:b], self.model.dims.num_mel_bins) for a, b in windows]
        return PreparedTranscription(params=params, features=features,
                                     window_samples=[b - a for a, b in windows],
                                     input_audio_ms=round(len(samples) * 1000 / 16000),
                                     language_id=language_id)

    def add_validated(self, request_id: str, prepared: PreparedTranscription) -> None:
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in flight", "request_id")
        seed = prepared.params.seed if prepared.params.seed is not None else random.getrandbits(31)
        generator = None
        if prepared.params.temperature > 0:
            generator = torch.Generator().manual_seed(seed)
        request = TranscriptionRequest(request_id, prepared, generator, language_id=prepared.language_id)
        self.requests[request_id] = request
        if request.num_windows == 0:  # nothing to hear (e.g. no speech under VAD)
            request.phase = Phase.FINISHED
            self.finished_unreported.append(request)
        else:
            self.encode_queue.append(request)

    def abort_request(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        if request in self.decoding:
            self.decoding.remove(request)
        if request in self.encode_queue:
            self.encode_queue.remove(request)
        self.kv.free(request)
        request.cross = None
        request.phase = Phase.FINISHED

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def start_background_compile(self) -> None:
        """Nothing to compile: the transcription engine runs eagerly."""

    # -- the step -----------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        touched = list(self.finished_unreported)
        self.finished_unreported.clear()
        encoded = self._encode_next_windows()
        scheduled = self._plan_decode()
        self.last_step_scheduled = bool(encoded or scheduled or touched)
        if scheduled:
            logits = self._run_decoder(scheduled)
            touched += self._advance(scheduled, logits)
            self.num_steps += 1
        return [self._output(r) for r in dict.fromkeys(touched)]

    def _encode_next_windows(self) -> list[TranscriptionRequest]:
        limit = ENCODE_BATCH_WHILE_DECODING if self.decoding else ENCODE_BATCH_IDLE
        batch = []
        while (self.encode_queue and len(batch) < limit
               and len(self.decoding) + len(batch) < self.config.max_num_seqs
               and self.kv.allocate(self.encode_queue[0], self.max_model_len)):
            batch.append(self.encode_queue.popleft())
        if not batch:
            return []
        with torch.inference_mode():
            features = torch.stack([r.prepared.features[r.window] for r in batch])
            encoded = self.model.encode(features.to(self.device, self.dtype))
            for request, encoder_out in zip(batch, encoded):
                request.cross = self.model.cross_kv(encoder_out)
        for request in batch:
            self._start_window(request)
            self.decoding.append(request)
        return batch

    def _start_window(self, request: TranscriptionRequest) -> None:
        vocab = self.vocab
        previous = request.text_token_ids[-MAX_PREVIOUS_TOKENS:]
        prompt = [vocab.sot_prev, *previous] if previous else []
        prompt.append(vocab.sot)
        if vocab.is_multilingual and request.language_id is None:
            request.detecting_language = True  # the language comes from this prompt's logits
        else:
            prompt += self._task_tokens(request)
        request.token_ids = prompt
        request.num_prompt_tokens = len(prompt)
        request.num_computed_tokens = 0
        request.phase = Phase.DECODE

    def _task_tokens(self, request: TranscriptionRequest) -> list[int]:
        vocab = self.vocab
        if not vocab.is_multilingual:
            return [vocab.no_timestamps]
        task = vocab.translate if request.prepared.params.task == "translate" else vocab.transcribe
        return [request.language_id, task, vocab.no_timestamps]

    def _plan_decode(self) -> list[tuple[TranscriptionRequest, int]]:
        """(request, tokens to compute) of each decoding request this step can take."""
        budget = self.config.max_num_batched_tokens
        plan = []
        for request in self.decoding:
            if budget <= 0:
                break
            n = min(len(request.token_ids) - request.num_computed_tokens, budget)
            plan.append((request, n))
            budget -= n
        return plan

    @torch.inference_mode()
    def _run_decoder(self, plan: list[tuple[TranscriptionRequest, int]]) -> torch.Tensor:
        """The step's tensors, built in one place, and the logits [len(plan), vocab] of
        each request's last scheduled token (rows of unfinished prompt chunks unused)."""
        input_ids, positions, seq_of_token, query_starts, context_lens = [], [], [], [0], []
        for i, (request, n) in enumerate(plan):
            start = request.num_computed_tokens
            input_ids += request.token_ids[start:start + n]
            positions += range(start, start + n)
            seq_of_token += [i] * n
            query_starts.append(query_starts[-1] + n)
            context_lens.append(start + n)
        width = max(len(r.block_table) for r, _ in plan)
        tables = torch.tensor([r.block_table + [0] * (width - len(r.block_table)) for r, _ in plan])
        pos = torch.tensor(positions)
        slots = tables[torch.tensor(seq_of_token), pos // self.block_size] * self.block_size \
            + pos % self.block_size
        dev = self.device
        meta = AttentionMetadata(slot_mapping=slots.to(dev),
                                 query_start=torch.tensor(query_starts, device=dev),
                                 context_lens=torch.tensor(context_lens, device=dev),
                                 block_tables=tables.to(dev))
        hidden = self.model.decode(torch.tensor(input_ids, device=dev), pos.to(dev), self.kv_caches,
                                   meta, [r.cross for r, _ in plan], query_starts)
        last = torch.tensor(query_starts[1:], device=dev) - 1
        return self.model.compute_logits(hidden[last]).float().cpu()

    def _advance(self, plan, logits: torch.Tensor) -> list[TranscriptionRequest]:
        touched = []
        rows, sampling = [], []
        for row, (request, n) in enumerate(plan):
            request.num_computed_tokens += n
            if request.num_computed_tokens < len(request.token_ids):
                continue  # a prompt chunk: no token yet
            if request.detecting_language:
                scores = logits[row].masked_fill(self.language_mask, -float("inf"))
                request.language_id = int(scores.argmax())
                request.detecting_language = False
                request.token_ids += self._task_tokens(request)
                request.num_prompt_tokens = len(request.token_ids)
                continue
            rows.append(row)
            sampling.append(request)
        if not sampling:
            return touched
        scores = logits[rows].masked_fill(self.suppress, -float("inf"))
        first = torch.tensor([len(r.token_ids) == r.num_prompt_tokens for r in sampling])
        scores = scores.masked_fill(first[:, None] & self.begin_suppress, -float("inf"))
        for request, row_scores in zip(sampling, scores):
            token = self._pick(request, row_scores)
            request.token_ids.append(token)
            request.new_token_ids.append(token)
            request.total_output_tokens += 1
            if token == self.vocab.eot or len(request.token_ids) >= self.max_model_len:
                self._end_window(request)
            touched.append(request)
        return touched

    @staticmethod
    def _pick(request: TranscriptionRequest, scores: torch.Tensor) -> int:
        temperature = request.prepared.params.temperature
        if temperature == 0:
            return int(scores.argmax())
        probs = torch.softmax(scores / temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=request.generator))

    def _end_window(self, request: TranscriptionRequest) -> None:
        text_ids = self._text_ids(request.window_output_ids)
        request.text_token_ids += text_ids
        request.finished_text += self.tokenizer.decode(text_ids)
        request.total_prompt_tokens += request.num_prompt_tokens
        request.token_ids, request.num_prompt_tokens, request.num_computed_tokens = [], 0, 0
        self.kv.free(request)
        request.cross = None
        self.decoding.remove(request)
        request.window += 1
        if request.window < request.num_windows:
            request.phase = Phase.ENCODE
            self.encode_queue.append(request)
        else:
            request.phase = Phase.FINISHED

    def _text_ids(self, token_ids: list[int]) -> list[int]:
        """Text tokens only: every special and timestamp token sits at eot or above."""
        return [t for t in token_ids if t < self.vocab.eot]

    def _output(self, request: TranscriptionRequest) -> RequestOutput:
        finished = request.phase is Phase.FINISHED
        text = request.finished_text
        if not finished:
            text += self.tokenizer.decode(self._text_ids(request.window_output_ids))
        text = text.lstrip()
        if not finished:  # hold back a partial UTF-8 character and trailing space
            text = text.rstrip("\ufffd").rstrip()
        delta = text[len(request.emitted_text):] if text.startswith(request.emitted_text) else ""
        request.emitted_text += delta
        new_ids, request.new_token_ids = request.new_token_ids, []
        if finished:
            self.requests.pop(request.request_id, None)
        return RequestOutput(
            request_id=request.request_id,
            outputs=[CompletionOutput(index=0, new_token_ids=new_ids, new_text=delta, new_logprobs=None,
                                      finish_reason="stop" if finished else None, seed=0,
                                      num_output_tokens=request.total_output_tokens)],
            num_prompt_tokens=request.total_prompt_tokens + request.num_prompt_tokens,
            num_cached_tokens=0, finished=finished,
            queued_seconds=None)

    # -- conveniences -------------------------------------------------------

    def transcribe(self, items: list[tuple[np.ndarray, list[tuple[int, int]], TranscriptionParams]]
                   ) -> list[FinalOutput]:
        """Run transcriptions to completion together (tests, benchmarks)."""
        finals = {}
        for i, (samples, windows, params) in enumerate(items):
            request_id = f"transcribe-{i}-{time.monotonic_ns()}"
            self.add_validated(request_id, self.validate(samples, windows, params))
            finals[request_id] = FinalOutput(request_id)
        while self.has_unfinished_requests():
            for out in self.step():
                finals[out.request_id].add(out)
        return list(finals.values())

    def stats(self) -> dict:
        return {
            "num_running": len(self.decoding),
            "num_waiting": len(self.encode_queue),
            "num_free_blocks": self.kv.pool.num_free_blocks,
            "num_total_blocks": self.kv.pool.num_blocks,
            "num_cached_blocks": 0,
            "prefix_cache_hit_rate": 0.0,
            "num_steps": self.num_steps,
        }


def _free_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read MemAvailable from /proc/meminfo")
