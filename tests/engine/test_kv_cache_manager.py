"""KVCacheManager and BlockPool on their own: ref counts, hash chaining, LRU order.

No model: requests are plain `Request` objects and "computing" a token is moving
`num_computed_tokens`, as the scheduler does after a step.
"""

import torch

from amity.engine.kv_cache_manager import BlockPool, KVCacheManager, block_hash
from amity.engine.request import Request
from amity.engine.sampling_params import SamplingParams

BS = 4  # block size


def req(rid: str, prompt: list[int], **kw) -> Request:
    return Request(request_id=rid, group_id=rid, choice_index=0, prompt_token_ids=list(prompt),
                   params=SamplingParams(temperature=0, max_tokens=8), seed=0,
                   eos_token_ids=frozenset(), max_output_tokens=8, min_output_tokens=0, **kw)


def compute(kv: KVCacheManager, r: Request, cached: list[int] | None = None) -> None:
    """Admit `r` the way the scheduler does and mark its whole prompt computed."""
    cached = kv.find_cached_blocks(r) if cached is None else cached
    assert kv.allocate(r, r.num_tokens, cached)
    r.num_cached_tokens = len(cached) * BS
    r.num_computed_tokens = r.num_tokens
    kv.cache_full_blocks(r)


def check_ref_counts(kv: KVCacheManager, live: list[Request]) -> None:
    """Every block's ref count is the number of live block tables holding it, and the
    free queue is exactly the blocks nobody holds."""
    pool = kv.pool
    for b in range(pool.num_blocks):
        assert pool.ref_counts[b] == sum(r.block_table.count(b) for r in live), b
    assert set(pool.free_queue) == {b for b in range(pool.num_blocks) if pool.ref_counts[b] == 0}


def test_block_hash_is_chained_over_the_whole_prefix():
    a = block_hash(None, [1, 2, 3, 4])
    assert a == block_hash(None, [1, 2, 3, 4])
    assert a != block_hash(None, [1, 2, 3, 5])
    # Same tokens in the second block, different first block: different hash.
    assert block_hash(a, [5, 6, 7, 8]) != block_hash(block_hash(None, [9, 9, 9, 9]), [5, 6, 7, 8])
    # Token ids are not confused across byte boundaries (e.g. 256 vs [0, 1]).
    assert block_hash(None, [256]) != block_hash(None, [0, 1])


def test_allocate_covers_tokens_and_free_returns_every_block():
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    r = req("a", range(10))
    assert kv.allocate(r, 10)
    assert len(r.block_table) == 3 and len(set(r.block_table)) == 3
    assert kv.pool.num_free_blocks == 5
    assert kv.allocate(r, 12)  # still inside the third block
    assert len(r.block_table) == 3
    assert kv.allocate(r, 13)  # crosses into a fourth
    assert len(r.block_table) == 4
    check_ref_counts(kv, [r])
    kv.free(r)
    assert r.block_table == []
    assert kv.pool.num_free_blocks == 8
    check_ref_counts(kv, [])


def test_allocate_fails_without_side_effects_when_short():
    kv = KVCacheManager(num_blocks=3, block_size=BS, enable_prefix_caching=True)
    a = req("a", range(8))
    assert kv.allocate(a, 8)
    b = req("b", range(100, 109))
    assert not kv.allocate(b, 9)  # needs 3 blocks, 1 free
    assert b.block_table == [] and kv.pool.num_free_blocks == 1
    check_ref_counts(kv, [a])


def test_cached_block_in_free_queue_is_not_counted_twice():
    """A free cached block taken as a prefix hit is no longer free for new blocks."""
    kv = KVCacheManager(num_blocks=3, block_size=BS, enable_prefix_caching=True)
    a = req("a", [1, 2, 3, 4, 5])
    compute(kv, a)
    kv.free(a)
    assert kv.pool.num_free_blocks == 3
    b = req("b", [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12])  # 11 tokens: 3 blocks, the first cached
    cached = kv.find_cached_blocks(b)
    assert cached == [a_block := cached[0]] and kv.pool.hash_of_block[a_block] is not None
    # 1 cached + 2 new = 3 = all blocks: fits.
    compute(kv, b, cached)
    kv.free(b)
    c = req("c", [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13, 14])  # 13 tokens: 4 blocks > 3
    cached = kv.find_cached_blocks(c)
    assert len(cached) == 2
    assert not kv.allocate(c, 13, cached)  # 2 cached (free) + 2 new > 3 free
    assert c.block_table == [] and kv.pool.num_free_blocks == 3
    check_ref_counts(kv, [])


def test_prefix_hit_shares_full_blocks_and_never_the_last_token():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    a = req("a", range(10))  # blocks: [0..3] [4..7] [8, 9]
    compute(kv, a)
    assert kv.pool.num_cached_blocks == 2  # the partial third block is not published

    b = req("b", list(range(8)) + [50, 51, 52])
    cached = kv.find_cached_blocks(b)
    assert cached == a.block_table[:2]
    compute(kv, b, cached)
    assert b.num_cached_tokens == 8
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    for blk in a.block_table[:2]:
        assert kv.pool.ref_counts[blk] == 2

    # Exactly two full blocks of prompt: the last token must be computed, so only one hits.
    c = req("c", range(8))
    assert kv.find_cached_blocks(c) == a.block_table[:1]
    # A one-block prompt never hits at all.
    assert kv.find_cached_blocks(req("d", range(4))) == []
    # The second block alone (different first block) does not hit: hashes are chained.
    e = req("e", [99, 98, 97, 96] + list(range(4, 8)) + [1])
    assert kv.find_cached_blocks(e) == []
    check_ref_counts(kv, [a, b])
    kv.free(a)
    kv.free(b)
    assert kv.pool.num_free_blocks == 16
    check_ref_counts(kv, [])


def test_a_block_hits_only_after_the_same_whole_prefix():
    """Block contents equal to another prompt's block at the same index, after a
    different first block, must not hit: its K/V depend on the whole prefix."""
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    a = req("a", [1, 2, 3, 4, 5, 6, 7, 8, 0])
    b = req("b", [9, 9, 9, 9, 10, 11, 12, 13, 0])
    compute(kv, a)
    compute(kv, b)
    c = req("c", [1, 2, 3, 4, 10, 11, 12, 13, 0])
    assert kv.find_cached_blocks(c) == a.block_table[:1]


def test_prefix_caching_disabled_never_hits_nor_publishes():
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    a = req("a", range(10))
    compute(kv, a)
    assert kv.pool.num_cached_blocks == 0
    assert kv.find_cached_blocks(req("b", range(10))) == []


def test_replaced_embeddings_stop_the_cacheable_prefix():
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    a = req("a", range(13), replaced_embeddings={5: torch.zeros(4)})
    compute(kv, a)
    assert kv.pool.num_cached_blocks == 1  # only the block before position 5
    b = req("b", range(13))
    assert kv.find_cached_blocks(b) == a.block_table[:1]
    # A request with a replaced embedding does not look up past it either.
    compute(kv, b)
    c = req("c", range(13), replaced_embeddings={6: torch.zeros(4)})
    assert kv.find_cached_blocks(c) == b.block_table[:1]


def test_free_cached_blocks_are_evicted_oldest_first():
    kv = KVCacheManager(num_blocks=4, block_size=BS, enable_prefix_caching=True)
    a = req("a", [1, 2, 3, 4, 5])
    b = req("b", [6, 7, 8, 9, 10])
    compute(kv, a)
    compute(kv, b)
    a_blocks = list(a.block_table)
    kv.free(a)  # a's blocks become free first: least recently used
    kv.free(b)
    c = req("c", [11, 12, 13, 14, 15])  # unrelated, two blocks: must evict a's, not b's
    compute(kv, c)
    assert set(c.block_table) == set(a_blocks)
    assert kv.find_cached_blocks(req("a2", [1, 2, 3, 4, 5])) == []
    b2 = req("b2", [6, 7, 8, 9, 10])
    assert len(kv.find_cached_blocks(b2)) == 1


def test_a_reused_block_becomes_most_recently_used():
    kv = KVCacheManager(num_blocks=4, block_size=BS, enable_prefix_caching=True)
    a = req("a", [1, 2, 3, 4, 5])
    b = req("b", [6, 7, 8, 9, 10])
    compute(kv, a)
    compute(kv, b)
    kv.free(a)
    kv.free(b)
    a2 = req("a2", [1, 2, 3, 4, 5])  # hit a's block: it moves behind b's in the LRU order
    compute(kv, a2)
    assert a2.num_cached_tokens == 4
    kv.free(a2)
    c = req("c", [11, 12, 13, 14, 15, 16, 17, 18, 19])  # three blocks: evicts b's full block
    compute(kv, c)
    kv.free(c)
    assert kv.find_cached_blocks(req("b3", [6, 7, 8, 9, 10])) == []
    assert len(kv.find_cached_blocks(req("a3", [1, 2, 3, 4, 5]))) == 1


def test_tail_blocks_are_evicted_before_shared_prefix_blocks():
    kv = KVCacheManager(num_blocks=5, block_size=BS, enable_prefix_caching=True)
    prompt = list(range(100, 117))  # 17 tokens: 4 full blocks + 1
    a = req("a", prompt)
    compute(kv, a)
    a_blocks = list(a.block_table)
    kv.free(a)
    z = req("z", [1, 2, 3, 4, 5, 6])  # unrelated, two blocks: evicts a's last two
    compute(kv, z)
    again = req("again", prompt)
    cached = kv.find_cached_blocks(again)
    assert cached == a_blocks[:3]  # the prefix survives; only the tail was evicted


def test_ref_counts_with_shared_blocks_through_finish_and_abort():
    kv = KVCacheManager(num_blocks=10, block_size=BS, enable_prefix_caching=True)
    prompt = list(range(9))
    a, b, c = req("a", prompt), req("b", prompt), req("c", prompt + [7, 7, 7, 7])
    for r in (a, b, c):
        compute(kv, r)
    shared = a.block_table[:2]
    assert b.block_table[:2] == shared and c.block_table[:2] == shared
    assert [kv.pool.ref_counts[blk] for blk in shared] == [3, 3]
    check_ref_counts(kv, [a, b, c])
    kv.free(b)
    check_ref_counts(kv, [a, c])
    # c grows by decoding, then is aborted midway.
    for token in [1, 2, 3, 4]:
        c.append_output(token)
    assert kv.allocate(c, c.num_tokens)
    check_ref_counts(kv, [a, c])
    kv.free(c)
    kv.free(a)
    assert kv.pool.num_free_blocks == 10
    check_ref_counts(kv, [])


def test_pool_reset_prefix_cache_forgets_free_blocks_only():
    pool = BlockPool(3)
    b0, b1 = pool.allocate(), pool.allocate()
    pool.publish(b0, b"x")
    pool.publish(b1, b"y")
    pool.release(b0)
    pool.reset_prefix_cache()
    assert pool.lookup(b"x") is None and pool.lookup(b"y") == b1


def test_a_decode_step_publishes_only_the_blocks_that_filled():
    """Issue 13 (defect 15): every step re-published every full block of every
    running request (64 requests of 4k tokens: 16k dict look-ups per step). Each
    block is offered to the cache once per residency; after a free, again."""
    kv = KVCacheManager(32, BS, enable_prefix_caching=True)
    offered = []
    publish = kv.pool.publish
    kv.pool.publish = lambda block, h: (offered.append(block), publish(block, h))
    r = req("r", list(range(10)))
    compute(kv, r)  # 10 tokens: 2 full blocks
    assert offered == r.block_table[:2]
    for step in range(30):  # decode 30 tokens, one a step
        r.append_output(100 + step)
        assert kv.allocate(r, r.num_tokens)
        r.num_computed_tokens = r.num_tokens
        kv.cache_full_blocks(r)
    assert offered == r.block_table[:10]  # 40 tokens: each full block once
    kv.free(r)
    compute(kv, r)  # readmitted from its cached blocks: offered again, harmlessly
    assert offered[10:] == r.block_table[:10] and r.num_cached_tokens == 36


def test_with_prompt_rows_a_block_of_generated_tokens_is_not_a_prompt_block():
    # models/prompt_rows.py: prompt and generated tokens may be computed apart, so a
    # block that holds generated tokens must not serve a prompt of the same tokens.
    kv = KVCacheManager(16, BS, enable_prefix_caching=True, prompt_rows_differ=True)
    first = req("first", [1, 2, 3, 4, 5, 6])
    compute(kv, first)
    for token in (7, 8, 9):  # generated: the second block fills with 5, 6 | 7, 8
        first.append_output(token)
    first.num_computed_tokens = first.num_tokens - 1
    kv.allocate(first, first.num_tokens)
    kv.cache_full_blocks(first)
    # A follow-up whose prompt is all of that: only the all-prompt block is reused.
    follow_up = req("follow-up", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert kv.find_cached_blocks(follow_up) == first.block_table[:1]
    assert first.block_hashes[1] != follow_up.block_hashes[1]
    # Without prompt rows (every token computed alike), the follow-up takes both blocks.
    plain = KVCacheManager(16, BS, enable_prefix_caching=True)
    first = req("first", [1, 2, 3, 4, 5, 6])
    compute(plain, first)
    for token in (7, 8, 9):
        first.append_output(token)
    first.num_computed_tokens = first.num_tokens - 1
    plain.allocate(first, first.num_tokens)
    plain.cache_full_blocks(first)
    assert plain.find_cached_blocks(req("follow-up", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10])) == first.block_table[:2]
