"""The synchronous engine core: add requests, `step()`, read outputs.

A step flows one way: scheduler plans -> model runner executes -> sampler picks
tokens -> detokenizer and stop checks -> per-request output deltas. Everything
here runs on one thread; `AsyncEngine` drives it from a background thread for the
web server.

Pooling requests (embeddings, classification: `add_pooling`) share the steps and the
token budget with generation; one finishes in the step that computes its last prompt
token, returns its blocks at once and reports one `PoolingOutput` (pooler.py).
"""

import contextlib
import itertools
import logging
import random
import threading
import time
from collections.abc import Iterable

import torch

from amity.config import EngineConfig, parse_memory
from amity.engine.detokenizer import IncrementalDetokenizer
from amity.engine.errors import RequestError
from amity.engine.input_batch import InputBatch
from amity.engine.kv_cache_manager import KVCacheManager
from amity.engine.encoder_runner import EncoderRunner
from amity.engine.engine_model import EngineModel, load_engine_model
from amity.engine.lora_manager import LoadedAdapter, LoraManager
from amity.engine.outputs import CompletionOutput, FinalOutput, PoolingOutput, RequestOutput, TokenLogprob
from amity.engine.pooling_params import PoolingParams, ValidatedPooling
from amity.engine.request import Request, RequestStatus, ValidatedRequest
from amity.engine.sampler import Sampler, SamplingRow
from amity.engine.sampling_params import SamplingParams
from amity.engine.scheduler import Scheduler
from amity.engine.token_history import TokenHistory, uses_history
from amity.engine import structured_output
from amity.engine.model_runner import ModelRunner
from amity.engine.background_compile import BackgroundCompile, CompileState, one_at_a_time
from amity.models.attention import kv_row_elements
from amity.models.compilation import CompiledForward, warm_up
from amity.models.dtype import prepare_device, resolve_kv_cache_dtype
from amity.models.loader import LoadedModel
from amity.models.lora import apply_lora
from amity.models.peft_adapter import AdapterError, LoraAdapter
from amity.models.prompt_rows import find_prompt_rows, resolve_prompt_tiles
from amity.models.quantization import quantize_model, resolve_scheme, rows_differ_by_role, weight_storage

logger = logging.getLogger("amity.engine")


def _free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read MemAvailable from /proc/meminfo")


class LLMEngine:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None):
        self.config = config
        self.device, self.dtype = prepare_device(config.device, config.dtype, config.num_threads)
        self.quantization = resolve_scheme(config.quantization, config.dtype)
        self.prompt_tiles = resolve_prompt_tiles(config.prompt_tiles, self.device)
        # LoRA wraps the loaded nn.Linears; quantization then replaces the base inside.
        self.lora: LoraManager | None = None
        wrap_lora = None
        if config.enable_lora or config.lora_modules:
            def wrap_lora(model: torch.nn.Module) -> None:
                self.lora = LoraManager(apply_lora(model, config.max_loras, config.max_lora_rank,
                                                   config.max_num_batched_tokens, self.device))
        if loaded is not None:
            if wrap_lora:
                wrap_lora(loaded.model)
            loaded.model = quantize_model(loaded.model, self.quantization, self.device,
                                          loaded.file_weights, self.prompt_tiles)
            served = EngineModel.generative(loaded)
        else:
            served = load_engine_model(config, self.dtype, self.device, wrap_lora)
        self.served = served
        self.task = served.task
        self.pooler = served.pooler
        self.model = served.network
        self._background_compile: BackgroundCompile | None = None
        self._compiled = False
        self.model_config = served.config
        self.tokenizer = served.tokenizer
        self.model_path = served.path
        hf = self.model_config
        self.vocab_size = hf.vocab_size
        self.hidden_size = getattr(hf, "hidden_size", None) or hf.dim  # DistilBERT: dim
        self.is_encoder_decoder = bool(getattr(hf, "is_encoder_decoder", False))
        # Sliding-window attention is not implemented: stay inside the window.
        limits = [served.max_input_len] if served.max_input_len else [
            hf.max_position_embeddings, getattr(hf, "sliding_window", None) or 1 << 30]
        if config.max_model_len:
            limits.append(config.max_model_len)
        self.max_model_len = min(limits)
        self.block_size = config.block_size
        self.sampler = Sampler()
        self.groups: dict[str, list[Request]] = {}
        self.detokenizers: dict[str, IncrementalDetokenizer] = {}
        # A pooling request's gathered hidden rows, kept until its prompt is computed.
        self.pooled_parts: dict[Request, list[torch.Tensor]] = {}
        self.num_steps = 0
        self.last_step_scheduled = False  # see step()
        self._generate_ids = itertools.count()
        self._structured: structured_output.StructuredOutputCompiler | None = None
        self._structured_lock = threading.Lock()
        if served.is_encoder:  # no KV cache: whole sequences, one step each
            self.num_blocks = 0
            self.kv_cache = None
            self.kv = KVCacheManager(0, self.block_size, enable_prefix_caching=False)
            self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens,
                                       whole_sequences=True)
            self.runner = EncoderRunner(self.model, self.device)
            logger.info("engine: %s (%s encoder) on %s (%s), context %d", self.model_path.name, self.task,
                        self.device, self.dtype, self.max_model_len)
            return
        self._init_kv_cache(config, hf)
        for module in config.lora_modules:
            route, sep, path = module.partition("=")
            if not sep:
                raise ValueError(f"--lora-modules takes ROUTE=PATH; got {module!r}")
            self.load_lora_adapter(route, path)
        if config.compile == "true" and served.can_generate:
            self._compile_now()

    def _init_kv_cache(self, config: EngineConfig, hf) -> None:
        num_layers = hf.num_hidden_layers
        num_kv_heads = hf.num_key_value_heads
        head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
        self.kv_cache_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, self.dtype, weight_storage(self.model))
        row_elements = kv_row_elements(head_dim, self.kv_cache_dtype)
        bytes_per_block = 2 * num_layers * self.block_size * num_kv_heads * row_elements * self.kv_cache_dtype.itemsize
        budget = parse_memory(config.kv_cache_memory, _free_memory_bytes(self.device))
        # More blocks than every sequence at full length can use would only sit idle.
        most_useful = config.max_num_seqs * -(-self.max_model_len // self.block_size)
        self.num_blocks = min(budget // bytes_per_block, most_useful)
        if self.num_blocks < 1:
            raise ValueError(f"KV cache budget {config.kv_cache_memory!r} holds no block "
                             f"({bytes_per_block} bytes each)")
        # Zeroed once, for a defined start; attention itself keeps the slots a sequence
        # does not own (stale, padded, never written) out of its output. One tensor for
        # every layer's K and V (attention.py's layout): the compiled forward takes one
        # input and guards one tensor instead of 2 x num_layers.
        self.kv_cache = torch.zeros((num_layers, 2, self.num_blocks, self.block_size, num_kv_heads, row_elements),
                                    dtype=self.kv_cache_dtype, device=self.device)
        prompt_rows = find_prompt_rows(self.model)
        self.kv = KVCacheManager(self.num_blocks, self.block_size, config.enable_prefix_caching,
                                 prompt_rows_differ=rows_differ_by_role(self.model, self.kv_cache_dtype, head_dim))
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, config.max_num_batched_tokens)
        batch = InputBatch(config.max_num_seqs, self.max_model_len, self.block_size)
        self.runner = ModelRunner(self.model, self.kv_cache, self.block_size, self.device, self.dtype,
                                  batch, self.lora.slots if self.lora else None, prompt_rows)
        logger.info("engine: %s (%s) on %s (%s), %d KV blocks of %d tokens (%s), context %d",
                    self.model_path.name, self.task, self.device, self.dtype, self.num_blocks,
                    self.block_size, self.kv_cache_dtype, self.max_model_len)

    def _compile_now(self) -> None:
        """`--compile true`: both compiled graphs (compilation.py) exist before the first request."""
        logger.info("compiling the model (--compile true); the first start on a machine takes about three minutes")
        started = time.perf_counter()
        forward = CompiledForward(self.model.forward, self.device)
        warm_up(forward, self.model, self.kv_cache)
        self.runner.forward, self._compiled = forward, True
        logger.info("compiled in %.1f s", time.perf_counter() - started)

    def start_background_compile(self) -> None:
        """`--compile auto`: compile beside the eager steps (background_compile.py); the
        first step after it is ready switches to the compiled graphs. What a server
        does when it starts serving (AsyncEngine.start); offline use stays eager."""
        if (self.config.compile == "auto" and self.served.can_generate and not self._compiled
                and self._background_compile is None):
            self._background_compile = BackgroundCompile(self.model, self.kv_cache)

    def _adopt_compiled(self) -> None:
        forward = self._background_compile.take()
        if forward is not None:
            self.runner.forward, self._compiled = forward, True
            self._background_compile = None

    @property
    def compile_state(self) -> CompileState:
        """Ready counts as compiled: the next step takes it."""
        background = self._background_compile
        if self._compiled or (background is not None and background.wait(0) and not background.failed):
            return CompileState.COMPILED
        if background is None:
            return CompileState.EAGER
        return CompileState.FAILED if background.failed else CompileState.COMPILING

    # -- LoRA adapters ------------------------------------------------------

    def _lora_or_refuse(self) -> LoraManager:
        if self.lora is None:
            raise AdapterError("this engine serves no LoRA adapters; start it with --enable-lora "
                               "or --lora-modules")
        return self.lora

    def read_lora_adapter(self, path: str) -> LoraAdapter:
        """An adapter's files, read and checked against the model (AdapterError if
        they do not fit): any thread."""
        return self._lora_or_refuse().read(path)

    def install_lora_adapter(self, route: str, adapter: LoraAdapter) -> LoadedAdapter:
        """Serve a `read_lora_adapter` result as `route`: on the engine thread, between steps."""
        return self._lora_or_refuse().install(route, adapter)

    def load_lora_adapter(self, route: str, path: str) -> LoadedAdapter:
        return self.install_lora_adapter(route, self.read_lora_adapter(path))

    def unload_lora_adapter(self, route: str) -> None:
        """Stop serving `route`; refused (AdapterInUse) while requests use it."""
        lora = self._lora_or_refuse()
        key = lora.get(route).cache_key
        in_flight = sum(1 for group in self.groups.values() for r in group
                        if r.adapter_cache_key == key and not r.is_finished)
        lora.remove(route, in_flight)

    def lora_adapters(self) -> dict[str, LoadedAdapter]:
        return self.lora.adapters if self.lora else {}

    def _adapter_of(self, params: SamplingParams | PoolingParams) -> LoadedAdapter | None:
        if params.adapter is None:
            return None
        adapter = self.lora_adapters().get(params.adapter)
        if adapter is None:
            raise RequestError(f"no LoRA adapter {params.adapter!r} is loaded; loaded: "
                               f"{sorted(self.lora_adapters())}", "model")
        return adapter

    # -- requests ---------------------------------------------------------

    @property
    def structured_outputs(self) -> structured_output.StructuredOutputCompiler:
        """The grammar compiler (issue 5), made on first use; thread-safe."""
        with self._structured_lock:
            if self._structured is None:
                self._structured = structured_output.StructuredOutputCompiler(
                    self.tokenizer.hf, self.vocab_size, self.tokenizer.eos_token_ids)
            return self._structured

    def compile_structured_output(self, params: SamplingParams):
        """The compiled grammar of `params` (None when unconstrained), from the cache
        after the first time; RequestError for a schema or regex it refuses. Safe to call
        from any thread: the server calls it on a worker thread before submitting."""
        spec = params.structured_output
        if spec is None or not spec.constrains:
            return None
        return self.structured_outputs.compile(spec)

    def validate(self, prompt_token_ids: list[int], params: SamplingParams,
                 embedding_to_replace: list[float] | None = None,
                 token_index_to_replace: list[int] | None = None) -> ValidatedRequest:
        """Check a request once, before it reaches the engine thread: RequestError
        (a 422 naming its field) for one the engine cannot serve as asked. Returns
        what `add_validated` needs, its grammar compiled. Reads only what is fixed
        at start-up, so it is safe on any thread."""
        if not self.served.can_generate:
            raise RequestError(f"this model cannot generate text: it is a {self.task} model", "model")
        num_prompt = len(prompt_token_ids)
        if num_prompt == 0:
            raise RequestError("the prompt is empty; give at least one token", "prompt")
        bad = [t for t in prompt_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})",
                               "tokens")
        if not self.is_encoder_decoder:
            if params.encoder_no_repeat_ngram != 1:
                raise RequestError("`encoder_no_repeat_ngram` is only allowed for encoder-decoder "
                                   "models; this model is decoder-only", "encoder_no_repeat_ngram")
            if params.encoder_repetition_penalty != 1.0:
                raise RequestError("`encoder_repetition_penalty` is only allowed for encoder-decoder "
                                   "models; this model is decoder-only", "encoder_repetition_penalty")
        for name, ids in (("forced_output_tokens", params.forced_output_tokens or []),
                          ("eos_token", params.eos_token or []),
                          ("bad_word_tokens", [t for s in params.bad_word_tokens for t in s]),
                          ("stop_tokens", [t for s in params.stop_tokens for t in s])):
            if any(not 0 <= t < self.vocab_size for t in ids):
                raise RequestError(f"`{name}` has token ids outside the vocabulary [0, {self.vocab_size})",
                                   name)
        self._check_seeds(params)
        self._adapter_of(params)
        limit = self.max_model_len
        if num_prompt >= limit:
            raise RequestError(f"the prompt has {num_prompt} tokens but the context length is {limit}; "
                               "shorten the prompt", "prompt")
        num_output = len(params.forced_output_tokens or []) or self._max_output_tokens(num_prompt, params)
        output_field = ("forced_output_tokens" if params.forced_output_tokens
                        else "max_total_tokens" if params.max_total_tokens is not None else "max_tokens")
        if num_prompt + num_output > limit:
            raise RequestError(
                f"the prompt ({num_prompt} tokens) plus the requested output ({num_output} tokens) "
                f"exceeds the context length {limit}; lower `max_tokens` or shorten the prompt", output_field)
        self._check_fits_kv_pool(num_prompt, num_output, output_field)
        if params.min_total_tokens is not None and params.min_total_tokens > num_prompt + num_output:
            raise RequestError("`min_total_tokens` exceeds the most tokens this request may reach",
                               "min_total_tokens")
        indices = token_index_to_replace or []
        vectors = embedding_to_replace or []
        if bool(indices) != bool(vectors):
            raise RequestError("`embedding_to_replace` and `token_index_to_replace` go together; give both",
                               "token_index_to_replace")
        if indices:
            if any(not 0 <= i < num_prompt for i in indices):
                raise RequestError(f"`token_index_to_replace` must index the prompt (0..{num_prompt - 1})",
                                   "token_index_to_replace")
            if len(set(indices)) != len(indices):
                raise RequestError("`token_index_to_replace` has repeated indices", "token_index_to_replace")
            if len(vectors) != len(indices) * self.hidden_size:
                raise RequestError(
                    f"`embedding_to_replace` has {len(vectors)} numbers; it needs "
                    f"{len(indices)} indices x hidden size {self.hidden_size} = "
                    f"{len(indices) * self.hidden_size}", "embedding_to_replace")
        replaced = {}
        if indices:
            rows = torch.tensor(vectors, dtype=torch.float32).view(len(indices), self.hidden_size)
            replaced = dict(zip(indices, rows))
        min_output = params.min_tokens
        if params.min_total_tokens is not None:
            min_output = max(0, params.min_total_tokens - num_prompt)
        eos_token_ids = (frozenset(params.eos_token) if params.eos_token is not None
                         else self.tokenizer.eos_token_ids)
        if not eos_token_ids and params.structured_output is not None and params.structured_output.constrains:
            # A grammar ends its output with an end-of-sequence token; without one it never could.
            raise RequestError("this model has no end-of-sequence token, so a constrained output "
                               "could never end; give `eos_token`", params.structured_output.field)
        return ValidatedRequest(
            prompt_token_ids=list(prompt_token_ids), params=params,
            max_output_tokens=self._max_output_tokens(num_prompt, params), min_output_tokens=min_output,
            eos_token_ids=eos_token_ids, replaced_embeddings=replaced,
            grammar=self.compile_structured_output(params))  # a refused grammar is a RequestError

    @staticmethod
    def _check_seeds(params: SamplingParams) -> None:
        """Each choice's generator takes a seed in [0, 2^64): an int seed gives
        choice i seed + i, so the last choice's must fit too; a list, each entry."""
        if params.seed is None:
            return
        bad = [i for i in range(params.n) if not 0 <= params.seed_for_choice(i) < 1 << 64]
        if not bad:
            return
        if isinstance(params.seed, list):
            raise RequestError(f"`seed` entries must be in [0, 2^64 - 1]; entry {bad[0]} is not", "seed")
        raise RequestError(f"`seed` must be in [0, 2^64 - 1], and so must seed + n - 1 (choice i "
                           f"samples with seed + i): {params.seed} with n = {params.n} is not", "seed")

    def _check_fits_kv_pool(self, num_prompt: int, num_output: int, output_field: str) -> None:
        """Refuse what could never be scheduled: a choice holding more KV blocks than
        the whole pool would wait forever. The last output token is sampled, never
        computed, so a choice's K/V peaks at prompt + output - 1 tokens. The n choices
        of a request need not fit together: preemption only ever takes the most
        recently admitted request, so the oldest always runs to its end alone."""
        capacity = self.num_blocks * self.block_size
        if num_prompt > capacity:  # whatever the output (the default one is then negative)
            raise RequestError(f"the prompt has {num_prompt} tokens but the server's KV cache holds "
                               f"{capacity}; shorten the prompt", "prompt")
        num_tokens = num_prompt + max(num_output, 1) - 1
        if -(-num_tokens // self.block_size) > self.num_blocks:
            raise RequestError(f"the request needs {num_tokens} tokens of KV cache but the server "
                               f"holds {capacity}; lower `{output_field}`", output_field)

    def _max_output_tokens(self, num_prompt: int, params: SamplingParams) -> int:
        if params.max_tokens is not None:
            return params.max_tokens
        if params.max_total_tokens is not None:
            return max(0, params.max_total_tokens - num_prompt)
        # The default: as far as the context, or the KV pool if that is smaller.
        return min(self.max_model_len, self.num_blocks * self.block_size) - num_prompt

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    embedding_to_replace: list[float] | None = None,
                    token_index_to_replace: list[int] | None = None) -> None:
        """Validate and add, on the calling thread (the offline path: `generate`, tests)."""
        self.add_validated(request_id, self.validate(prompt_token_ids, params, embedding_to_replace,
                                                     token_index_to_replace))

    def add_validated(self, request_id: str, validated: ValidatedRequest) -> None:
        """Queue a request `validate` accepted: no second validation, no grammar
        compile (the engine thread never compiles). Every choice (request, generator,
        detokenizer, grammar matcher) is built before any enters the scheduler, so a
        failure raises with nothing left behind."""
        if request_id in self.groups:
            raise RequestError(f"request id {request_id!r} is already in flight", "request_id")
        v, params = validated, validated.params
        adapter = self._adapter_of(params)  # unloaded since validation: refused here
        group: list[Request] = []
        detokenizers: list[IncrementalDetokenizer] = []
        for i in range(params.n):
            seed = params.seed_for_choice(i)
            request = Request(
                request_id=f"{request_id}#{i}", group_id=request_id, choice_index=i,
                prompt_token_ids=v.prompt_token_ids, params=params,
                seed=seed if seed is not None else random.getrandbits(31),
                eos_token_ids=v.eos_token_ids, max_output_tokens=v.max_output_tokens,
                min_output_tokens=v.min_output_tokens, replaced_embeddings=v.replaced_embeddings,
                forced_token_ids=list(params.forced_output_tokens or []),
                prefix_source=group[0] if group and self.config.enable_prefix_caching else None)
            if adapter is not None:
                request.adapter_slot, request.adapter_cache_key = adapter.slot, adapter.cache_key
            if v.grammar is not None:
                request.grammar = self.structured_outputs.matcher(v.grammar, v.eos_token_ids)
            group.append(request)
            detokenizers.append(IncrementalDetokenizer(
                self.tokenizer, v.prompt_token_ids,
                [] if params.forced_output_tokens else params.stop,  # forced output never stops early
                params.skip_special_tokens, v.min_output_tokens))
        # Nothing above touched engine state; nothing below can fail.
        self.groups[request_id] = group
        for request, detokenizer in zip(group, detokenizers):
            self.detokenizers[request.request_id] = detokenizer
            self.scheduler.add(request)

    def validate_pooling(self, prompt_token_ids: list[int], params: PoolingParams) -> ValidatedPooling:
        """Check a pooling input once, on any thread: RequestError (a 422 naming its
        field) for one this engine cannot pool. An input longer than the model's
        limit is refused, never truncated."""
        if params.task != self.pooler.task:
            raise RequestError(f"this model cannot {params.task}: it is a {self.task} model", "model")
        num_prompt = len(prompt_token_ids)
        if num_prompt == 0:
            raise RequestError("the input has no tokens (this model's tokenizer adds none to an empty "
                               "text); give at least one token", "input")
        bad = [t for t in prompt_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})",
                               "tokens")
        if num_prompt > self.max_model_len:
            raise RequestError(f"the input has {num_prompt} tokens but this model reads at most "
                               f"{self.max_model_len}; shorten it", "input")
        if not self.served.is_encoder and -(-num_prompt // self.block_size) > self.num_blocks:
            raise RequestError(f"the input has {num_prompt} tokens but the server's KV cache holds "
                               f"{self.num_blocks * self.block_size}; shorten it", "input")
        self._adapter_of(params)
        return ValidatedPooling(list(prompt_token_ids), params)

    def add_pooling(self, request_id: str, validated: ValidatedPooling) -> None:
        """Queue a pooling input `validate_pooling` accepted."""
        if request_id in self.groups:
            raise RequestError(f"request id {request_id!r} is already in flight", "request_id")
        ids = validated.prompt_token_ids
        adapter = self._adapter_of(validated.params)  # unloaded since validation: refused here
        request = Request.pooling(request_id, ids, validated.params, self.pooler.pooled_positions(len(ids)))
        if adapter is not None:
            request.adapter_slot, request.adapter_cache_key = adapter.slot, adapter.cache_key
        self.groups[request_id] = [request]
        self.scheduler.add(request)

    def abort_request(self, request_id: str) -> None:
        for request in self.groups.pop(request_id, []):
            if not request.is_finished:
                self.scheduler.finish(request, RequestStatus.FINISHED_ABORTED)
            self.detokenizers.pop(request.request_id, None)
            self.pooled_parts.pop(request, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.groups)

    # -- the step -----------------------------------------------------------

    def step(self) -> list[RequestOutput | PoolingOutput]:
        """Run one step; the outputs of the choices that moved. An empty list does
        not mean nothing ran (a prefill chunk emits nothing): `last_step_scheduled`
        says. False with requests unfinished means none can run until a request is
        added or aborted, so a driving loop waits for its next command instead of
        stepping again."""
        if self._background_compile is not None:
            self._adopt_compiled()
        plan = self.scheduler.schedule()
        self.last_step_scheduled = bool(plan.scheduled)
        if not plan.scheduled:
            return []
        # While a compile runs beside it, no fx trace of the compile's meanwhile.
        with one_at_a_time() if self._background_compile is not None else contextlib.nullcontext():
            result = self.runner.execute(plan)
        self.scheduler.update_after_step(plan)
        self.num_steps += 1
        for request in plan.preempted:  # recomputed from the start: its rows come again
            self.pooled_parts.pop(request, None)
        pooled = self._finish_pooling(plan, result)

        new_tokens: dict[str, list[int]] = {}
        new_logprobs: dict[str, list[TokenLogprob]] = {}
        sampled = [i for i, (r, _) in enumerate(result.logit_rows) if not r.forced_token_ids]
        forced = [i for i, (r, _) in enumerate(result.logit_rows) if r.forced_token_ids]
        for request, token, logprob in self._sample(result, sampled) + self._score_forced(result, forced):
            request.append_output(token)
            new_tokens.setdefault(request.request_id, []).append(token)
            if logprob is not None:
                new_logprobs.setdefault(request.request_id, []).append(logprob)

        touched_groups: dict[str, list[CompletionOutput]] = {}
        for s in plan.scheduled:
            request = s.request
            tokens = new_tokens.get(request.request_id)
            if tokens is None:
                continue  # a prefill chunk that produced no token yet
            detok = self.detokenizers[request.request_id]
            stop_string = detok.add(tokens)
            finish = self._check_stop(request, stop_string)
            if finish is not None:
                self.scheduler.finish(request, finish)
            logprobs = new_logprobs.get(request.request_id) if request.params.logprobs is not None else None
            touched_groups.setdefault(request.group_id, []).append(CompletionOutput(
                index=request.choice_index, new_token_ids=tokens,
                new_text=detok.take_new_text(request.is_finished), new_logprobs=logprobs,
                finish_reason=request.status.value if request.is_finished else None,
                seed=request.seed, num_output_tokens=request.num_output_tokens,
                stop_reason=request.stop_reason))
        return pooled + [self._group_output(group_id, outs) for group_id, outs in touched_groups.items()]

    def _finish_pooling(self, plan, result) -> list[PoolingOutput]:
        """Keep the step's pooled rows; pool the requests whose prompt is now computed,
        all in one call, and end them (their blocks return at once)."""
        offset = 0
        for request, count in result.pooled_rows:
            self.pooled_parts.setdefault(request, []).append(result.pooled_hidden[offset:offset + count])
            offset += count
        done = [s.request for s in plan.scheduled if s.request.is_pooling and s.request.is_prefill_done]
        if not done:
            return []
        parts = [self.pooled_parts.pop(request) for request in done]
        rows = torch.cat([p for request_parts in parts for p in request_parts])
        lens = [sum(len(p) for p in request_parts) for request_parts in parts]
        seq_starts = torch.tensor([0, *itertools.accumulate(lens)], device=rows.device)
        with torch.inference_mode():
            values = self.pooler(rows, seq_starts).cpu()
        outputs = []
        for request, value in zip(done, values):
            self.scheduler.finish(request, RequestStatus.FINISHED_STOPPED)
            del self.groups[request.group_id]
            outputs.append(PoolingOutput(request.group_id, value, request.num_prompt_tokens,
                                         request.num_cached_tokens or 0))
        return outputs

    def _sample(self, result, indices: list[int]) -> list[tuple[Request, int, TokenLogprob | None]]:
        """Sample the next token of each request whose logits row is in `indices`."""
        if not indices:
            return []
        requests = [result.logit_rows[i][0] for i in indices]
        # Issue 5: constrained rows' disallowed tokens to -inf, before every processor.
        constrained = [k for k, r in enumerate(requests) if r.grammar is not None]
        logits = result.logits
        if constrained or indices != list(range(logits.shape[0])):
            logits = logits[indices]  # a copy: the grammar masks edit it in place
        if constrained:
            structured_output.apply_bitmasks(logits, constrained, [requests[k].grammar for k in constrained])
        batch = self.runner.batch  # a kept history only for rows whose parameters read one
        # The sampler may edit the logits in place: a copy of the rows above, or every
        # row of the step's, which then has no forced rows for _score_forced to read.
        out = self.sampler(logits, [self._row(r, r.all_token_ids, batch.history(r) if uses_history(r.params) else None)
                                    for r in requests], editable=True)
        for request, token in zip(requests, out.token_ids):
            if request.grammar is not None and not request.grammar.accept(token):
                logger.error("request %s: the grammar refused sampled token %d", request.request_id, token)
                request.grammar_failed = True
        return list(zip(requests, out.token_ids, out.logprobs))

    def _score_forced(self, result, indices: list[int]) -> list[tuple[Request, int, TokenLogprob]]:
        """The forced token at each position in `indices`, with its logprob: all of a
        request's forced positions come from one pass over prompt + forced tokens."""
        if not indices:
            return []
        rows, picks = [], []
        for i in indices:
            request, position = result.logit_rows[i]
            k = position - (request.num_prompt_tokens - 1)  # the forced token this position predicts
            # The history at forced position k: the prompt and the forced tokens before it.
            rows.append(self._row(request, request.all_token_ids[:request.num_prompt_tokens + k]))
            picks.append((request, request.forced_token_ids[k]))
        scores = self.sampler.score(result.logits[indices], rows, [token for _, token in picks])
        return [(request, token, score) for (request, token), score in zip(picks, scores)]

    def _row(self, request: Request, token_ids: list[int], history: TokenHistory | None = None) -> SamplingRow:
        return SamplingRow(params=request.params, token_ids=token_ids,
                           num_prompt_tokens=request.num_prompt_tokens, generator=request.generator,
                           eos_token_ids=request.eos_token_ids, history=history)

    def _check_stop(self, request: Request, stop_string: str | None) -> RequestStatus | None:
        if request.forced_token_ids:  # >=, not ==: a miscount must never run forever
            done = request.num_output_tokens >= len(request.forced_token_ids)
            return RequestStatus.FINISHED_STOPPED if done else None
        if request.grammar is not None:  # issue 5: the grammar decides where output ends
            if request.grammar_failed:
                return RequestStatus.FINISHED_LENGTH
            if request.grammar.is_terminated():
                return RequestStatus.FINISHED_STOPPED
        tokens, num_output = request.all_token_ids, request.num_output_tokens
        if num_output >= request.min_output_tokens:
            if tokens[-1] in request.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            for seq in request.params.stop_tokens:  # matched within the output only
                if len(seq) <= num_output and tokens[-len(seq):] == seq:
                    request.stop_reason = tuple(seq)
                    return RequestStatus.FINISHED_STOPPED
            if stop_string is not None:
                request.stop_reason = stop_string
                return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= request.max_output_tokens or request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _group_output(self, group_id: str, outs: list[CompletionOutput]) -> RequestOutput:
        group = self.groups[group_id]
        finished = all(r.is_finished for r in group)
        first = group[0]
        scheduled = [r.first_scheduled_time for r in group if r.first_scheduled_time is not None]
        output = RequestOutput(request_id=group_id, outputs=outs, num_prompt_tokens=first.num_prompt_tokens,
                               # The prompt is computed once per request; siblings sharing
                               # its blocks are not cache hits from the user's view.
                               num_cached_tokens=first.num_cached_tokens or 0,
                               finished=finished,
                               queued_seconds=min(scheduled) - first.arrival_time if scheduled else None)
        if finished:
            for request in self.groups.pop(group_id):
                self.detokenizers.pop(request.request_id, None)
        return output

    # -- conveniences -------------------------------------------------------

    def generate(self, prompts: Iterable[list[int] | str], params: SamplingParams) -> list[FinalOutput]:
        """Run prompts to completion (for the CLI, tests and benchmarks)."""
        finals: dict[str, FinalOutput] = {}
        for i, prompt in enumerate(prompts):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
            request_id = f"generate-{next(self._generate_ids)}"
            self.add_request(request_id, ids, params)
            finals[request_id] = FinalOutput(request_id)
        while self.has_unfinished_requests():
            for out in self.step():
                if out.request_id in finals:
                    finals[out.request_id].add(out)
        return list(finals.values())

    def pool(self, prompts: Iterable[list[int] | str], params: PoolingParams) -> list[PoolingOutput]:
        """Embed or classify prompts to completion, in order (for tests and benchmarks)."""
        ids = [self.served.encode_input(p) if isinstance(p, str) else p for p in prompts]
        request_ids = [f"pool-{next(self._generate_ids)}" for _ in ids]
        for request_id, prompt in zip(request_ids, ids):
            self.add_pooling(request_id, self.validate_pooling(prompt, params))
        outputs: dict[str, PoolingOutput] = {}
        while self.has_unfinished_requests():
            for out in self.step():
                if isinstance(out, PoolingOutput):
                    outputs[out.request_id] = out
        return [outputs[request_id] for request_id in request_ids]

    def stats(self) -> dict:
        pool = self.kv.pool
        return {
            "num_running": len(self.scheduler.running),
            "num_waiting": len(self.scheduler.waiting),
            "num_free_blocks": pool.num_free_blocks,
            "num_total_blocks": pool.num_blocks,
            "num_cached_blocks": pool.num_cached_blocks,
            "prefix_cache_hit_rate": self.kv.prefix_cache_hit_rate,
            "num_steps": self.num_steps,
            "compile_state": int(self.compile_state),
        }
