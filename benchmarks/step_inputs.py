"""The cost of building one step's tensors (`ModelRunner.prepare`) for decode steps,
without a model: N requests at a given context, each step one token each, as a
running batch grows.

    .venv/bin/python benchmarks/step_inputs.py

Prints the median microseconds per `prepare` after 20 warm-up steps. It also runs on
trees from before the persistent input batch (commit 3de9958, `PYTHONPATH=<that tree>`),
whose runner takes no batch: that is the before/after in benchmarks/README.md.
"""

import inspect
import statistics
import time

import torch

from amity.engine.model_runner import ModelRunner
from amity.engine.request import Request
from amity.engine.sampling_params import SamplingParams
from amity.engine.scheduler import ScheduledRequest, SchedulerOutput

BLOCK_SIZE = 16
STEPS = 300


def runner_for(num_seqs: int, max_model_len: int) -> ModelRunner:
    args = (None, [], BLOCK_SIZE, torch.device("cpu"), torch.float32)
    if "batch" not in inspect.signature(ModelRunner.__init__).parameters:
        return ModelRunner(*args)
    from amity.engine.input_batch import InputBatch

    return ModelRunner(*args, InputBatch(num_seqs, max_model_len, BLOCK_SIZE))


def median_prepare_us(num_seqs: int, context: int) -> float:
    requests = []
    for i in range(num_seqs):
        r = Request(request_id=f"r{i}", group_id=f"r{i}", choice_index=0, prompt_token_ids=list(range(context)),
                    params=SamplingParams(temperature=0, max_tokens=STEPS), seed=0, eos_token_ids=frozenset(),
                    max_output_tokens=STEPS, min_output_tokens=0)
        first = i * (context // BLOCK_SIZE + STEPS)  # disjoint blocks per request
        r.block_table = list(range(first, first + context // BLOCK_SIZE + 1))
        r.num_computed_tokens = context - 1
        requests.append(r)
    runner = runner_for(num_seqs, context + STEPS + BLOCK_SIZE)
    times = []
    for _ in range(STEPS):
        plan = SchedulerOutput(scheduled=[ScheduledRequest(r, 1) for r in requests])
        started = time.perf_counter()
        runner.prepare(plan)
        times.append(time.perf_counter() - started)
        for r in requests:  # what the step would do: one token computed and one appended
            r.num_computed_tokens += 1
            r.append_output(7)
            if r.num_tokens > len(r.block_table) * BLOCK_SIZE:
                r.block_table.append(r.block_table[-1] + 1)
    return statistics.median(times[20:]) * 1e6


if __name__ == "__main__":
    for num_seqs, context in [(1, 128), (32, 256), (64, 2048)]:
        print(f"{num_seqs} requests at context {context}: prepare {median_prepare_us(num_seqs, context):.0f} us")
