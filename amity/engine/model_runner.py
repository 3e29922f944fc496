"""Executes a scheduled step: builds its tensors, runs the model, returns logits
and the hidden rows that pooling requests read.

`prepare` is the one place where a step's tensors are made: token ids, positions,
KV slots and block tables gathered from the persistent input batch
(input_batch.py), and from each request which positions need logits and which
rows are pooled. The LM head runs only on the positions whose logits the
engine needs; the pooled rows are gathered in one indexing op. With LoRA, each
token also carries its request's adapter slot (models/lora.py).
"""

from dataclasses import dataclass, field

import numpy as np
import torch

from amity.engine.input_batch import InputBatch
from amity.engine.request import Request
from amity.engine.scheduler import SchedulerOutput
from amity.models.attention import AttentionMetadata
from amity.models.lora import LoraSlots
from amity.models.prompt_rows import PromptRows


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attn: AttentionMetadata
    logits_indices: torch.Tensor  # [N] rows of the flat batch whose logits we need
    logit_rows: list[tuple[Request, int]]  # (request, position) of each logits row
    replaced_indices: torch.Tensor | None  # flat indices whose embedding is replaced
    replaced_vectors: torch.Tensor | None
    pooled_indices: torch.Tensor  # [P] rows of the flat batch that pooling requests read
    pooled_rows: list[tuple[Request, int]]  # (pooling request, how many of those rows), in order
    adapter_slots: torch.Tensor | None  # [T] each token's LoRA slot (-1: base); None without LoRA
    prompt_rows: torch.Tensor | None  # [T] bool: tokens at prompt positions; None unless the model asks


@dataclass
class StepResult:
    logits: torch.Tensor | None  # [N, vocab] float32; None when no row needs logits
    logit_rows: list[tuple[Request, int]]
    pooled_hidden: torch.Tensor | None = None  # [P, hidden]: the pooled rows, in pooled_rows' order
    pooled_rows: list[tuple[Request, int]] = field(default_factory=list)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_cache: torch.Tensor,
                 block_size: int, device: torch.device, dtype: torch.dtype, batch: InputBatch,
                 lora: LoraSlots | None = None, prompt_rows: PromptRows | None = None):
        self.model = model
        self.batch = batch
        # The decoder stack: the model itself, or its compiled forward (compilation.py),
        # swapped in between two steps.
        self.forward = model
        self.lora = lora
        self.prompt_rows = prompt_rows
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.device = device
        self.dtype = dtype

    def prepare(self, step: SchedulerOutput) -> StepInputs:
        requests = [s.request for s in step.scheduled]
        rows = self.batch.sync(requests)
        num_seqs = len(requests)
        starts = np.fromiter((s.start_position for s in step.scheduled), np.int64, num_seqs)
        counts = np.fromiter((s.num_new_tokens for s in step.scheduled), np.int64, num_seqs)
        query_start = np.zeros(num_seqs + 1, dtype=np.int64)
        np.cumsum(counts, out=query_start[1:])
        # Flat token t belongs to sequence seq_of_token[t], at position positions[t].
        seq_of_token = np.repeat(np.arange(num_seqs), counts)
        positions = np.arange(query_start[-1]) + np.repeat(starts - query_start[:-1], counts)
        input_ids = self.batch.token_ids[rows[seq_of_token], positions].astype(np.int64)
        num_blocks = self.batch.num_synced_blocks[rows]
        width = int(num_blocks.max())
        tables = self.batch.block_tables[rows, :width]
        tables[np.arange(width)[None, :] >= num_blocks[:, None]] = 0  # a row's stale tail
        slot_mapping = tables[seq_of_token, positions // self.block_size] * self.block_size \
            + positions % self.block_size

        logits_indices: list[int] = []
        logit_rows: list[tuple[Request, int]] = []
        replaced_idx: list[int] = []
        replaced_vec: list[torch.Tensor] = []
        pooled_indices: list[int] = []
        pooled_rows: list[tuple[Request, int]] = []
        for i, req in enumerate(requests):
            start, end, flat_start = int(starts[i]), int(starts[i] + counts[i]), int(query_start[i])
            if req.is_pooling:
                first = max(start, req.pooled_positions.start)
                last = min(end, req.pooled_positions.stop)
                if first < last:
                    pooled_indices.extend(range(flat_start + first - start, flat_start + last - start))
                    pooled_rows.append((req, last - first))
                continue
            first = max(start, req.first_logit_position)
            logits_indices.extend(range(flat_start + first - start, flat_start + end - start))
            logit_rows.extend((req, p) for p in range(first, end))
            for p, vector in req.replaced_embeddings.items():
                if start <= p < end:
                    replaced_idx.append(flat_start + p - start)
                    replaced_vec.append(vector)

        dev = self.device
        attn = AttentionMetadata(
            slot_mapping=torch.from_numpy(slot_mapping).to(dev),
            query_start=torch.from_numpy(query_start).to(dev),
            context_lens=torch.from_numpy(starts + counts).to(dev),
            block_tables=torch.from_numpy(tables).to(dev),
        )
        adapter_slots = None
        if self.lora:
            slots = np.fromiter((r.adapter_slot for r in requests), np.int64, num_seqs)
            adapter_slots = torch.from_numpy(np.repeat(slots, counts)).to(dev)
        prompt_rows = None
        if self.prompt_rows is not None:
            prompt_lens = np.fromiter((r.num_prompt_tokens for r in requests), np.int64, num_seqs)
            prompt_rows = torch.from_numpy(positions < prompt_lens[seq_of_token])
        return StepInputs(
            input_ids=torch.from_numpy(input_ids).to(dev),
            positions=torch.from_numpy(positions).to(dev),
            attn=attn,
            logits_indices=torch.tensor(logits_indices, dtype=torch.long, device=dev),
            logit_rows=logit_rows,
            replaced_indices=torch.tensor(replaced_idx, dtype=torch.long, device=dev) if replaced_idx else None,
            replaced_vectors=torch.stack(replaced_vec).to(dev, self.dtype) if replaced_vec else None,
            pooled_indices=torch.tensor(pooled_indices, dtype=torch.long, device=dev),
            pooled_rows=pooled_rows,
            adapter_slots=adapter_slots,
            prompt_rows=prompt_rows,
        )

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput) -> StepResult:
        inputs = self.prepare(step)
        embeds = self.model.embed(inputs.input_ids)
        if inputs.replaced_indices is not None:
            embeds = embeds.index_copy(0, inputs.replaced_indices, inputs.replaced_vectors)
        if self.lora is not None:
            self.lora.set_step(inputs.adapter_slots)
        if self.prompt_rows is not None:
            self.prompt_rows.set_step(inputs.prompt_rows)
        hidden = self.forward(embeds, inputs.positions, self.kv_cache, inputs.attn)
        logits = None
        if inputs.logit_rows:
            logits = self.model.compute_logits(hidden[inputs.logits_indices]).float()
        pooled = hidden[inputs.pooled_indices] if inputs.pooled_rows else None
        return StepResult(logits, inputs.logit_rows, pooled, inputs.pooled_rows)
