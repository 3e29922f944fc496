"""KV blocks: a ref-counted pool, hash-chained for prefix caching.

A full block's hash covers its token ids and the hash of the block before it, so
equal hashes mean an equal whole prefix. Prefix caching is then a lookup at
allocation: a new request walks its full prompt blocks and takes every block
already in the cache. Blocks whose ref count falls to zero keep their contents and
hash, and sit in a free queue in least-recently-used order; allocation takes from
the front of that queue, evicting the cached contents it overwrites.
"""

import hashlib
from array import array
from collections import OrderedDict

from amity.engine.request import Request


def block_hash(parent_hash: bytes | None, token_ids: list[int]) -> bytes:
    """A collision-resistant digest: a collision would hand one prompt another's K/V.
    Anything else that changes a block's K/V (a LoRA adapter) joins the chain here."""
    digest = hashlib.blake2b(parent_hash or b"", digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


class BlockPool:
    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.hash_of_block: list[bytes | None] = [None] * num_blocks
        self.block_of_hash: dict[bytes, int] = {}
        # Free blocks, least recently used first. Python dicts keep order.
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.block_of_hash)

    def lookup(self, h: bytes) -> int | None:
        return self.block_of_hash.get(h)

    def allocate(self) -> int:
        block, _ = self.free_queue.popitem(last=False)
        self._evict(block)
        self.ref_counts[block] = 1
        return block

    def touch(self, block: int) -> None:
        """Take a reference to a cached block (it may be free or in use)."""
        if self.ref_counts[block] == 0:
            del self.free_queue[block]
        self.ref_counts[block] += 1

    def release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_queue[block] = None

    def publish(self, block: int, h: bytes) -> None:
        if h not in self.block_of_hash:
            self.block_of_hash[h] = block
            self.hash_of_block[block] = h

    def _evict(self, block: int) -> None:
        h = self.hash_of_block[block]
        if h is not None:
            self.hash_of_block[block] = None
            if self.block_of_hash.get(h) == block:
                del self.block_of_hash[h]

    def reset_prefix_cache(self) -> None:
        for block in list(self.free_queue):
            self._evict(block)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool,
                 prompt_rows_differ: bool = False):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # Prompt and generated tokens computed apart (models/prompt_rows.py): a block
        # holding generated tokens is not the block a prompt of the same tokens makes.
        self.prompt_rows_differ = prompt_rows_differ
        self.pool = BlockPool(num_blocks)
        self.num_lookups = 0  # prompt tokens looked up in the cache
        self.num_hits = 0  # of which found

    def _hashes(self, request: Request, num_blocks: int) -> list[bytes]:
        """The chained hashes of (at least) the request's first `num_blocks` full
        blocks: the request's own list, not a copy."""
        hashes = request.block_hashes
        tokens = request.all_token_ids
        while len(hashes) < num_blocks:
            i = len(hashes)
            chunk = tokens[i * self.block_size:(i + 1) * self.block_size]
            prompt_in_block = request.num_prompt_tokens - i * self.block_size
            if self.prompt_rows_differ and prompt_in_block < self.block_size:
                chunk = chunk + [-1 - max(prompt_in_block, 0)]  # where the prompt ends; ids are >= 0
            # The first block's parent is the adapter's key: adapters never share blocks.
            hashes.append(block_hash(hashes[-1] if hashes else request.adapter_cache_key, chunk))
        return hashes

    def find_cached_blocks(self, request: Request) -> list[int]:
        """The blocks of the request's longest cached prefix. Positions that still
        owe an output (the last token; forced positions not yet scored; the hidden
        states a pooling request reads) are always left to compute."""
        if not self.enable_prefix_caching:
            return []
        limit = min(request.cacheable_prefix_len, request.first_owed_position)
        blocks = []
        num_blocks = limit // self.block_size
        for h in self._hashes(request, num_blocks)[:num_blocks]:
            block = self.pool.lookup(h)
            if block is None:
                break
            blocks.append(block)
        self.num_lookups += request.num_tokens
        self.num_hits += len(blocks) * self.block_size
        return blocks

    def _num_new_blocks(self, request: Request, num_total_tokens: int, num_cached_blocks: int) -> int:
        have = len(request.block_table) + num_cached_blocks
        return max(0, -(-num_total_tokens // self.block_size) - have)

    def allocate(self, request: Request, num_total_tokens: int, cached_blocks: list[int] = ()) -> bool:
        """Make the request's block table cover `num_total_tokens`, first taking
        `cached_blocks` (its cached prefix). False, changing nothing, if short."""
        # Cached blocks that sit in the free queue are not free to take twice.
        num_free_cached = sum(1 for b in cached_blocks if self.pool.ref_counts[b] == 0)
        num_new = self._num_new_blocks(request, num_total_tokens, len(cached_blocks))
        if num_new > self.pool.num_free_blocks - num_free_cached:
            return False
        for block in cached_blocks:
            self.pool.touch(block)
        request.block_table.extend(cached_blocks)
        for _ in range(num_new):
            request.block_table.append(self.pool.allocate())
        return True

    def cache_full_blocks(self, request: Request) -> None:
        """Publish the request's blocks that are now full of computed tokens."""
        if not self.enable_prefix_caching:
            return
        num_full = min(request.num_computed_tokens, request.cacheable_prefix_len) // self.block_size
        # Only the blocks that filled since the last call: this runs every step.
        hashes = self._hashes(request, num_full)
        for i in range(request.num_published_blocks, num_full):
            self.pool.publish(request.block_table[i], hashes[i])
        request.num_published_blocks = max(request.num_published_blocks, num_full)

    def free(self, request: Request) -> None:
        # Tail blocks first, so they reach the front of the LRU queue first and
        # are evicted before the shared prefix blocks.
        for block in reversed(request.block_table):
            self.pool.release(block)
        request.block_table = []
        request.num_published_blocks = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.num_hits / self.num_lookups if self.num_lookups else 0.0
