"""The transcription engine core: Whisper requests, batched step by step.

Driven like `LLMEngine` (by `AsyncEngine`'s thread, or `transcribe` offline): add
requests, `step()`, read `RequestOutput` deltas. A step:

1. encodes the next 30 s window of waiting requests (FIFO; one window while others are
   decoding, so a long recording's next window costs the others one encoder pass,
   more at once when nothing decodes), computing each window's cross-attention K/V
   once and keeping them with the request until the window ends; a window is admitted
   only when the KV pool can hold a whole window (448 decoder tokens), so nothing is
   ever preempted;
2. runs one decoder pass over every decoding request together (prompts in chunks
   under `max_num_batched_tokens`, then one token each), self-attention K/V in the
   paged KV cache;
3. picks each next token as `transformers`' Whisper generation does: suppress tokens,
   begin-suppress tokens at a window's first output, the timestamp rules (the whole
   file's windows; whisper_timestamps.py), greedy at temperature 0;
4. ends a window at <|endoftext|> (or at 448 tokens): decodes it again hotter if it looks
   degenerate (transcription_fallback.py), else keeps its complete segments, seeks to
   where they end, frees its blocks and queues the request's next window behind the
   others (windows are scheduled like chunks). A window's text is output once kept.
"""

import collections
import logging
import random
import time

import numpy as np
import torch
import torch.nn.functional as F

from amity.audio.mel import WINDOW_FRAMES, WINDOW_SAMPLES, log_mel
from amity.config import EngineConfig, parse_memory
from amity.engine.errors import RequestError
from amity.engine.kv_cache_manager import KVCacheManager
from amity.engine.outputs import CompletionOutput, FinalOutput, RequestOutput
from amity.engine.transcription_fallback import (PROMPT_RESET_TEMPERATURE, Attempt, best_attempt,
                                                 temperature_schedule)
from amity.engine.transcription_request import (MAX_PREVIOUS_TOKENS, Phase, PreparedTranscription,
                                                TranscriptionParams, TranscriptionRequest)
from amity.engine.whisper_timestamps import TimestampTokens, apply_timestamp_rules, conditioning_tokens, split_window
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
        self.timestamps = TimestampTokens(eot=self.vocab.eot, no_timestamps=self.vocab.no_timestamps,
                                          begin=self.vocab.no_timestamps + 1)
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

    def validate(self, samples: np.ndarray, windows: list[tuple[int, int]] | None,
                 params: TranscriptionParams) -> PreparedTranscription:
        """`windows`: None for the whole file (over 30 s read with timestamps, window by
        window from where the last one's complete segments end; up to 30 s one window
        without them), or [start, end) sample ranges of at
        most 30 s each (VAD's; each decoded once without timestamps). Computes the log-mel
        features; safe on any thread."""
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
        bins = self.model.dims.num_mel_bins
        # Timestamps only where a file outlasts one window (transformers' long-form; its
        # short-form, up to 30 s, decodes without them, and its text streams token by token).
        long_form = windows is None and len(samples) > WINDOW_SAMPLES
        if windows is None:  # up to 30 s: padded to one window; longer: unpadded, as transformers'
            features = [log_mel(samples, bins, whole=long_form)]
            window_samples = [len(samples)]
        else:
            features = [log_mel(samples[a:b], bins) for a, b in windows]
            window_samples = [b - a for a, b in windows]
        return PreparedTranscription(params=params, features=features, timestamps=long_form,
                                     window_samples=window_samples,
                                     input_audio_ms=round(len(samples) * 1000 / 16000),
                                     language_id=language_id)

    def add_validated(self, request_id: str, prepared: PreparedTranscription) -> None:
        if request_id in self.requests:
            raise RequestError(f"request id {request_id!r} is already in flight", "request_id")
        params = prepared.params
        seed = params.seed
        if seed is None:  # greedy requests fall back to sampling reproducibly
            seed = 0 if params.temperature == 0 else random.getrandbits(31)
        request = TranscriptionRequest(
            request_id, prepared, torch.Generator().manual_seed(seed), language_id=prepared.language_id,
            temperatures=(temperature_schedule(params.temperature) if params.temperature_fallback
                          else (params.temperature,)))
        self.requests[request_id] = request
        if not prepared.features:  # nothing to hear (e.g. no speech under VAD)
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
            features = torch.stack([self._window_features(r) for r in batch])
            encoded = self.model.encode(features.to(self.device, self.dtype))
            for request, encoder_out in zip(batch, encoded):
                request.cross = self.model.cross_kv(encoder_out)
        for request in batch:
            self._start_window(request)
            self.decoding.append(request)
        return batch

    @staticmethod
    def _window_features(request: TranscriptionRequest) -> torch.Tensor:
        """The 30 s from `seek`; past the block's end zeros, as transformers pads them."""
        window = request.prepared.features[request.block][:, request.seek:request.seek + WINDOW_FRAMES]
        return F.pad(window, (0, WINDOW_FRAMES - window.shape[1]))

    def _start_window(self, request: TranscriptionRequest) -> None:
        vocab = self.vocab
        request.failed_attempts, request.sum_logprob = [], 0.0
        previous = request.previous_token_ids[-MAX_PREVIOUS_TOKENS:]
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
        no_timestamps = [] if request.prepared.timestamps else [vocab.no_timestamps]
        if not vocab.is_multilingual:
            return no_timestamps
        task = vocab.translate if request.prepared.params.task == "translate" else vocab.transcribe
        return [request.language_id, task, *no_timestamps]

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
        timed = [i for i, r in enumerate(sampling) if r.prepared.timestamps]
        if timed:
            scores[timed] = apply_timestamp_rules(scores[timed], [sampling[i].window_output_ids for i in timed],
                                                  self.timestamps)
        # Of the processed logits, as Whisper's fallback reads them; only the fallback does.
        fallback = any(r.uses_fallback for r in sampling)
        logprobs = torch.log_softmax(scores, dim=-1) if fallback else None
        for row, (request, row_scores) in enumerate(zip(sampling, scores)):
            token = self._pick(request, row_scores)
            request.token_ids.append(token)
            if logprobs is not None:
                request.sum_logprob += float(logprobs[row, token])
            request.total_output_tokens += 1
            if token == self.vocab.eot or len(request.token_ids) >= self.max_model_len:
                self._end_window(request)
                touched.append(request)
            elif not request.uses_fallback and self._finalize(request):
                touched.append(request)
        return touched

    def _finalize(self, request: TranscriptionRequest) -> bool:
        """A window that no fallback can decode again: how much of its output is final
        already. Without timestamps all of it; with them, all before a segment that a
        pair of timestamps just opened (the window's end keeps at least that much,
        split_window). True when more became final."""
        output = request.window_output_ids
        final = len(output)
        if request.prepared.timestamps:
            begin = self.timestamps.begin
            if not (len(output) >= 2 and output[-1] >= begin and output[-2] >= begin):
                return False
            final = len(output) - 1
        if final <= request.num_final_output_tokens:
            return False
        request.new_token_ids += output[request.num_final_output_tokens:final]
        request.num_final_output_tokens = final
        return True

    @staticmethod
    def _pick(request: TranscriptionRequest, scores: torch.Tensor) -> int:
        temperature = request.temperature
        if temperature == 0:
            return int(scores.argmax())
        probs = torch.softmax(scores / temperature, dim=-1)
        return int(torch.multinomial(probs, 1, generator=request.generator))

    def _end_window(self, request: TranscriptionRequest) -> None:
        generated = request.window_output_ids
        temperature = request.temperature  # the last one tried (faster-whisper's prompt reset reads it)
        if request.uses_fallback:  # the fallback judges the try
            attempt = Attempt(generated, self.tokenizer.decode(self._text_ids(generated)), request.sum_logprob)
            if not attempt.acceptable:
                request.failed_attempts.append(attempt)
                if len(request.failed_attempts) < len(request.temperatures):
                    # The same window again, hotter: its cross K/V and its prompt's K/V stay;
                    # the prompt's last token is computed again for the first output's logits.
                    request.sum_logprob = 0.0
                    del request.token_ids[request.num_prompt_tokens:]
                    request.num_computed_tokens = request.num_prompt_tokens - 1
                    return
                generated = best_attempt(request.failed_attempts).token_ids
        output = generated[:-1] if generated[-1] == self.vocab.eot else generated
        text_ids = self._text_ids(output)
        block_frames = request.prepared.features[request.block].shape[1]
        if request.prepared.timestamps:
            segments, seek_frames = split_window(output, self.timestamps.begin,
                                                 min(WINDOW_FRAMES, block_frames - request.seek))
            kept = [t for segment in segments for t in segment]
            conditioning = conditioning_tokens(segments, self.timestamps.begin)
        else:
            kept, seek_frames, conditioning = output, block_frames, text_ids
        request.new_token_ids += kept[request.num_final_output_tokens:]
        request.finished_text += self.tokenizer.decode(self._text_ids(kept))
        # OpenAI's prompt reset: text decoded this hot conditions nothing after it.
        if temperature > PROMPT_RESET_TEMPERATURE:
            request.previous_token_ids = []
        else:
            request.previous_token_ids += conditioning
        request.total_prompt_tokens += request.num_prompt_tokens
        request.token_ids, request.num_prompt_tokens, request.num_computed_tokens = [], 0, 0
        request.num_final_output_tokens = 0
        self.kv.free(request)
        request.cross = None
        self.decoding.remove(request)
        request.seek += seek_frames
        if request.seek >= block_frames:
            request.block, request.seek = request.block + 1, 0
        if request.block < len(request.prepared.features):
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
        if request.num_final_output_tokens:
            final = request.window_output_ids[:request.num_final_output_tokens]
            text += self.tokenizer.decode(self._text_ids(final))
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

    def transcribe(self, items: list[tuple[np.ndarray, list[tuple[int, int]] | None, TranscriptionParams]]
                   ) -> list[FinalOutput]:
        """Run transcriptions to completion together (tests, benchmarks); windows as
        `validate` takes them."""
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
