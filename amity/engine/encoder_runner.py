"""Executes a step of an encoder (BERT family): whole sequences, no KV cache.

The scheduler hands an encoder's requests over whole (`Scheduler.whole_sequences`),
so a step is their prompts packed end to end (`PackedBatch`) through the network's
bidirectional `hidden_states`; the rows each request's pooling reads are then
gathered in one indexing op, as the paged runner does for a decoder's.
"""

import torch

from amity.engine.model_runner import StepResult
from amity.engine.scheduler import SchedulerOutput
from amity.models.packed_batch import pack


class EncoderRunner:
    def __init__(self, network: torch.nn.Module, device: torch.device):
        self.network = network  # has hidden_states(PackedBatch) -> [T, hidden]
        self.device = device

    @torch.inference_mode()
    def execute(self, step: SchedulerOutput) -> StepResult:
        batch = pack([s.request.all_token_ids for s in step.scheduled], self.device)
        hidden = self.network.hidden_states(batch)
        pooled_indices: list[int] = []
        pooled_rows = []
        for s, seq_start in zip(step.scheduled, batch.seq_starts.tolist()):
            positions = s.request.pooled_positions
            pooled_indices.extend(range(seq_start + positions.start, seq_start + positions.stop))
            pooled_rows.append((s.request, len(positions)))
        pooled = hidden[torch.tensor(pooled_indices, dtype=torch.long, device=self.device)]
        return StepResult(None, [], pooled, pooled_rows)
