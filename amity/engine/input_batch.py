"""The persistent input batch: each running request's token ids and block table,
kept in preallocated arrays across steps (vLLM v1's InputBatch), so a step's
tensors are gathered with a few vectorised indexing ops instead of being rebuilt
from Python lists.

A row mirrors one request. Syncing a row copies only what the request gained since
the step before: `Request.all_token_ids` only ever grows, and its `block_table` only
grows until the request's blocks are freed, which replaces the list (preemption,
finish): a row that sees another list object starts its blocks again. A row is a
cache, never the source of truth, so a request that leaves the batch needs no
message: its row is reused for a newcomer, the least recently scheduled first.
The sampler's history of a request (token_history.py) lives with its row the same
way: made on first use, dropped when the row changes hands.
"""

import numpy as np

from amity.engine.request import Request
from amity.engine.token_history import TokenHistory


class InputBatch:
    def __init__(self, max_num_rows: int, max_model_len: int, block_size: int):
        self.block_size = block_size
        max_blocks = -(-max_model_len // block_size)
        self.token_ids = np.zeros((max_num_rows, max_model_len), dtype=np.int32)
        self.block_tables = np.zeros((max_num_rows, max_blocks), dtype=np.int64)
        self.num_synced_tokens = np.zeros(max_num_rows, dtype=np.int64)
        self.num_synced_blocks = np.zeros(max_num_rows, dtype=np.int64)
        self._row_of: dict[Request, int] = {}
        self._owner: list[Request | None] = [None] * max_num_rows
        self._block_list: list[list[int] | None] = [None] * max_num_rows  # the list object a row mirrors
        self._histories: list[TokenHistory | None] = [None] * max_num_rows
        self._last_step = np.full(max_num_rows, -1, dtype=np.int64)
        self._step = 0

    def sync(self, requests: list[Request]) -> np.ndarray:
        """The rows of `requests` (one step's, distinct), each brought up to date."""
        self._step += 1
        rows = np.empty(len(requests), dtype=np.int64)
        for i, request in enumerate(requests):
            row = self._row_of.get(request)
            if row is None:
                row = self._claim(request)
            self._last_step[row] = self._step
            self._sync_row(row, request)
            rows[i] = row
        return rows

    def history(self, request: Request) -> TokenHistory:
        """The sampler's history of a request that holds a row (any request of the
        last `sync`), kept with that row."""
        row = self._row_of[request]
        if self._histories[row] is None:
            self._histories[row] = TokenHistory(request.params)
        return self._histories[row]

    def _claim(self, request: Request) -> int:
        row = int(np.argmin(self._last_step))  # a free row (-1) or the stalest one
        if self._last_step[row] == self._step:
            raise RuntimeError("more requests in one step than the input batch has rows")
        old = self._owner[row]
        if old is not None:
            del self._row_of[old]
        self._owner[row] = request
        self._row_of[request] = row
        self._block_list[row] = None
        self._histories[row] = None
        self.num_synced_tokens[row] = 0
        self.num_synced_blocks[row] = 0
        return row

    def _sync_row(self, row: int, request: Request) -> None:
        tokens = request.all_token_ids
        have = int(self.num_synced_tokens[row])
        if have < len(tokens):
            self.token_ids[row, have:len(tokens)] = tokens[have:]
            self.num_synced_tokens[row] = len(tokens)
        blocks = request.block_table
        if self._block_list[row] is not blocks:
            self._block_list[row] = blocks
            self.num_synced_blocks[row] = 0
        have = int(self.num_synced_blocks[row])
        if have < len(blocks):
            self.block_tables[row, have:len(blocks)] = blocks[have:]
            self.num_synced_blocks[row] = len(blocks)
