"""Executes a scheduled step: builds its tensors, runs the model, returns logits
and the hidden rows that pooling requests read.

`prepare` is the one place where a step's tensors are made from plain Python
state (token ids, positions, KV slots, block tables, which positions need logits,
which rows are pooled). The LM head runs only on the positions whose logits the
engine needs; the pooled rows are gathered in one indexing op. With LoRA, each
token also carries its request's adapter slot (models/lora.py).
"""

from dataclasses import dataclass, field

import torch

from amity.engine.request import Request
from amity.engine.scheduler import SchedulerOutput
from amity.models.attention import AttentionMetadata
from amity.models.lora import LoraSlots


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


@dataclass
class StepResult:
    logits: torch.Tensor | None  # [N, vocab] float32; None when no row needs logits
    logit_rows: list[tuple[Request, int]]
    pooled_hidden: torch.Tensor | None = None  # [P, hidden]: the pooled rows, in pooled_rows' order
    pooled_rows: list[tuple[Request, int]] = field(default_factory=list)


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 block_size: int, device: torch.device, dtype: torch.dtype, lora: LoraSlots | None = None):
        self.model = model
        # The decoder stack: the model itself, or its compiled forward (compilation.py),
        # swapped in between two steps.
        self.forward = model
        self.lora = lora
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.dtype = dtype

    def prepare(self, step: SchedulerOutput) -> StepInputs:
        input_ids: list[int] = []
        positions: list[int] = []
        seq_of_token: list[int] = []
        query_start = [0]
        context_lens: list[int] = []
        block_tables: list[list[int]] = []
        logits_indices: list[int] = []
        logit_rows: list[tuple[Request, int]] = []
        replaced_idx: list[int] = []
        replaced_vec: list[torch.Tensor] = []
        pooled_indices: list[int] = []
        pooled_rows: list[tuple[Request, int]] = []
        adapter_slots: list[int] = []
        for i, s in enumerate(step.scheduled):
            req, start, n = s.request, s.start_position, s.num_new_tokens
            flat_start = len(input_ids)
            input_ids.extend(req.all_token_ids[start:start + n])
            positions.extend(range(start, start + n))
            seq_of_token.extend([i] * n)
            adapter_slots.extend([req.adapter_slot] * n)
            query_start.append(flat_start + n)
            context_lens.append(start + n)
            block_tables.append(req.block_table)
            if req.is_pooling:
                first = max(start, req.pooled_positions.start)
                end = min(start + n, req.pooled_positions.stop)
                if first < end:
                    pooled_indices.extend(range(flat_start + first - start, flat_start + end - start))
                    pooled_rows.append((req, end - first))
                continue
            for p in range(max(start, req.first_logit_position), start + n):
                logits_indices.append(flat_start + p - start)
                logit_rows.append((req, p))
            for p, vector in req.replaced_embeddings.items():
                if start <= p < start + n:
                    replaced_idx.append(flat_start + p - start)
                    replaced_vec.append(vector)

        width = max(len(t) for t in block_tables)
        tables = torch.tensor([t + [0] * (width - len(t)) for t in block_tables], dtype=torch.long)
        pos = torch.tensor(positions, dtype=torch.long)
        slot_mapping = tables[torch.tensor(seq_of_token), pos // self.block_size] * self.block_size \
            + pos % self.block_size
        dev = self.device
        attn = AttentionMetadata(
            slot_mapping=slot_mapping.to(dev),
            query_start=torch.tensor(query_start, dtype=torch.long, device=dev),
            context_lens=torch.tensor(context_lens, dtype=torch.long, device=dev),
            block_tables=tables.to(dev),
        )
        return StepInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.long, device=dev),
            positions=pos.to(dev),
            attn=attn,
            logits_indices=torch.tensor(logits_indices, dtype=torch.long, device=dev),
            logit_rows=logit_rows,
            replaced_indices=torch.tensor(replaced_idx, dtype=torch.long, device=dev) if replaced_idx else None,
            replaced_vectors=torch.stack(replaced_vec).to(dev, self.dtype) if replaced_vec else None,
            pooled_indices=torch.tensor(pooled_indices, dtype=torch.long, device=dev),
            pooled_rows=pooled_rows,
            adapter_slots=torch.tensor(adapter_slots, dtype=torch.long, device=dev) if self.lora else None,
        )

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput) -> StepResult:
        inputs = self.prepare(step)
        embeds = self.model.embed(inputs.input_ids)
        if inputs.replaced_indices is not None:
            embeds = embeds.index_copy(0, inputs.replaced_indices, inputs.replaced_vectors)
        if self.lora is not None:
            self.lora.set_step(inputs.adapter_slots)
        hidden = self.forward(embeds, inputs.positions, self.kv_caches, inputs.attn)
        logits = None
        if inputs.logit_rows:
            logits = self.model.compute_logits(hidden[inputs.logits_indices]).float()
        pooled = hidden[inputs.pooled_indices] if inputs.pooled_rows else None
        return StepResult(logits, inputs.logit_rows, pooled, inputs.pooled_rows)
