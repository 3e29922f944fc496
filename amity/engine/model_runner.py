"""Executes a scheduled step: builds its tensors, runs the model, returns logits.

`prepare` is the one place where a step's tensors are made from plain Python
state (token ids, positions, KV slots, block tables, which positions need logits).
The LM head runs only on the positions whose logits the engine needs.
"""

from dataclasses import dataclass

import torch

from amity.engine.request import Request
from amity.engine.scheduler import SchedulerOutput
from amity.models.attention import AttentionMetadata


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    attn: AttentionMetadata
    logits_indices: torch.Tensor  # [N] rows of the flat batch whose logits we need
    logit_rows: list[tuple[Request, int]]  # (request, position) of each logits row
    replaced_indices: torch.Tensor | None  # flat indices whose embedding is replaced
    replaced_vectors: torch.Tensor | None


@dataclass
class StepResult:
    logits: torch.Tensor  # [N, vocab] float32
    logit_rows: list[tuple[Request, int]]


class ModelRunner:
    def __init__(self, model: torch.nn.Module, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 block_size: int, device: torch.device, dtype: torch.dtype):
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.device = device
        self.dtype = dtype

    def prepare(self, step: SchedulerOutput) -> StepInputs:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[torch.Tensor] = []
        slots: list[torch.Tensor] = []
        logits_indices: list[int] = []
        logit_rows: list[tuple[Request, int]] = []
        replaced_idx: list[int] = []
        replaced_vec: list[torch.Tensor] = []
        prefill_starts, prefill_lens, prefill_ctx, prefill_slots = [], [], [], []
        decode_idx, decode_slots, decode_ctx = [], [], []
        for s in step.scheduled:
            req, start, n = s.request, s.start_position, s.num_new_tokens
            flat_start = len(input_ids)
            input_ids.extend(req.all_token_ids[start:start + n])
            pos = torch.arange(start, start + n)
            table = torch.tensor(req.block_table, dtype=torch.long)
            positions.append(pos)
            # Slot of every position up to the end of this chunk: the new tokens'
            # slots are its tail, and attention reads the whole context through it.
            context_slots = (table[:, None] * bs + torch.arange(bs)).reshape(-1)[:start + n]
            slots.append(context_slots[start:])
            for p in range(max(start, req.first_logit_position), start + n):
                logits_indices.append(flat_start + p - start)
                logit_rows.append((req, p))
            for p, vector in req.replaced_embeddings.items():
                if start <= p < start + n:
                    replaced_idx.append(flat_start + p - start)
                    replaced_vec.append(vector)
            if n == 1:
                decode_idx.append(flat_start)
                decode_slots.append(context_slots)
                decode_ctx.append(start + 1)
            else:
                prefill_starts.append(flat_start)
                prefill_lens.append(n)
                prefill_ctx.append(start + n)
                prefill_slots.append(context_slots.to(self.device))

        max_len = max((len(s) for s in decode_slots), default=0)
        padded = torch.zeros(len(decode_slots), max_len, dtype=torch.long)
        for i, s in enumerate(decode_slots):
            padded[i, :len(s)] = s
        key_mask = torch.arange(max_len)[None, :] < torch.tensor(decode_ctx, dtype=torch.long)[:, None]
        dev = self.device
        attn = AttentionMetadata(
            slot_mapping=torch.cat(slots).to(dev),
            prefill_query_starts=prefill_starts,
            prefill_query_lens=prefill_lens,
            prefill_context_lens=prefill_ctx,
            prefill_context_slots=prefill_slots,
            decode_token_indices=torch.tensor(decode_idx, dtype=torch.long, device=dev),
            decode_context_slots=padded.to(dev),
            decode_key_mask=key_mask[:, None, None, :].to(dev),
        )
        return StepInputs(
            input_ids=torch.tensor(input_ids, dtype=torch.long, device=dev),
            positions=torch.cat(positions).to(dev),
            attn=attn,
            logits_indices=torch.tensor(logits_indices, dtype=torch.long, device=dev),
            logit_rows=logit_rows,
            replaced_indices=torch.tensor(replaced_idx, dtype=torch.long, device=dev) if replaced_idx else None,
            replaced_vectors=torch.stack(replaced_vec).to(dev, self.dtype) if replaced_vec else None,
        )

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput) -> StepResult:
        inputs = self.prepare(step)
        embeds = self.model.embed(inputs.input_ids)
        if inputs.replaced_indices is not None:
            embeds = embeds.index_copy(0, inputs.replaced_indices, inputs.replaced_vectors)
        hidden = self.model(embeds, inputs.positions, self.kv_caches, inputs.attn)
        logits = self.model.compute_logits(hidden[inputs.logits_indices]).float()
        return StepResult(logits, inputs.logit_rows)
