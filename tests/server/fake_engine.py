"""A fake engine core: what `AsyncEngine` drives, without a model.

`FakeCore` stands in for `LLMEngine` under the real `AsyncEngine`, so the server's
failure paths (an add that raises, a step that raises, a loop that dies, a shutdown,
a request that can never be scheduled) run through the real event-loop/engine-thread
machinery, fast and on demand. Each step emits one token for every live choice; a
request finishes after `max_tokens` (default 4) tokens.

Knobs, set from the test thread at any time (the engine thread reads them at its next
add or step): `add_error`, `step_error`, `die_with` (a BaseException, raised out of
the loop), `hold` (a step blocks until `release()`), `schedulable`. It records what
reached it: `adds` (request id, number of step calls before it), `aborts`,
`step_batches` (the request ids each scheduled step served), `step_calls`.
"""

import threading
from pathlib import Path

from amity.engine.outputs import CompletionOutput, RequestOutput
from amity.engine.request import ValidatedRequest
from amity.models.tokenizer import Tokenizer


class LoopKilled(BaseException):
    """Not an `Exception`: nothing in the engine loop catches it, so the loop dies."""


class FakeCore:
    def __init__(self, tokenizer: Tokenizer, max_model_len: int = 512):
        self.tokenizer = tokenizer
        self.model_path = Path("/models/fake-model.gguf")  # AsyncEngine names the model from it
        self.max_model_len = max_model_len
        self.vocab_size = tokenizer.vocab_size
        self.is_encoder_decoder = False
        self.task = "generate"  # the routes it serves (server/tasks.py)
        self.token_id = tokenizer.encode("fox", add_special_tokens=False)[0]
        # Knobs.
        self.add_error: Exception | None = None
        self.step_error: Exception | None = None
        self.die_with: BaseException | None = None
        self.schedulable = True
        self.hold = False
        self._released = threading.Event()
        self.step_delay_s = 0.005  # a step takes some time, as a real one does
        # What reached the core.
        self.live: dict[str, dict] = {}  # request id -> {"max": int, "done": int, "n": int}
        self.adds: list[tuple[str, int]] = []
        self.aborts: list[str] = []
        self.step_batches: list[list[str]] = []
        self.step_calls = 0  # every call, scheduled or not: what a spinning loop inflates
        self.num_steps = 0  # scheduled steps, as LLMEngine counts them
        self.last_step_scheduled = False
        self.holding = threading.Event()  # set while a held step waits

    # -- what AsyncEngine calls ---------------------------------------------

    def validate(self, prompt_token_ids, params, embedding_to_replace=None,
                 token_index_to_replace=None) -> ValidatedRequest:
        return ValidatedRequest(
            prompt_token_ids=list(prompt_token_ids), params=params,
            max_output_tokens=params.max_tokens or 4, min_output_tokens=0,
            eos_token_ids=frozenset(), replaced_embeddings={}, grammar=None)

    def add_validated(self, request_id: str, validated: ValidatedRequest) -> None:
        self.adds.append((request_id, self.step_calls))
        if self.add_error is not None:
            # Half-added, as a failing add might leave it: AsyncEngine must roll it back.
            self.live[request_id] = {}
            raise self.add_error
        self.live[request_id] = {"max": validated.max_output_tokens, "done": 0,
                                 "n": validated.params.n,
                                 "prompt": len(validated.prompt_token_ids)}

    def abort_request(self, request_id: str) -> None:
        self.aborts.append(request_id)
        self.live.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.live)

    def step(self) -> list[RequestOutput]:
        self.step_calls += 1
        if self.die_with is not None:
            raise self.die_with
        if self.step_error is not None:
            raise self.step_error
        if self.hold:
            self.holding.set()
            self._released.wait()
            self.holding.clear()
        self.last_step_scheduled = self.schedulable
        if not self.schedulable:
            return []
        threading.Event().wait(self.step_delay_s)
        self.num_steps += 1
        self.step_batches.append(list(self.live))
        outputs = []
        for request_id, state in list(self.live.items()):
            state["done"] += 1
            finished = state["done"] >= state["max"]
            text = self.tokenizer.decode([self.token_id])
            outputs.append(RequestOutput(
                request_id=request_id,
                outputs=[CompletionOutput(index=i, new_token_ids=[self.token_id], new_text=text,
                                          new_logprobs=None,
                                          finish_reason="length" if finished else None,
                                          seed=0, num_output_tokens=state["done"])
                         for i in range(state["n"])],
                num_prompt_tokens=state["prompt"], num_cached_tokens=0, finished=finished,
                queued_seconds=0.0))
            if finished:
                del self.live[request_id]
        return outputs

    def start_background_compile(self) -> None:
        pass  # no model

    def release(self) -> None:
        self.hold = False
        self._released.set()

    def stats(self) -> dict:
        return {"num_running": len(self.live), "num_waiting": 0, "num_free_blocks": 0,
                "num_total_blocks": 0, "num_cached_blocks": 0, "prefix_cache_hit_rate": 0.0,
                "num_steps": self.num_steps}
