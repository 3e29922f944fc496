"""Paged attention against its definition.

Each case is a step mixing decodes, short chunks over a cached context, and long
chunks with and without a cached context (the PyTorch reference's SDPA paths; the
C++ kernel computes every row alone), with blocks scattered through the pool. Both
the C++ kernel and the PyTorch reference must equal attention written out densely
in float64: query i of a chunk of q_len tokens, context_len tokens long after the
step, sees keys 0 .. context_len - q_len + i, and query head h reads K/V head
h // (H / Hkv).
"""

import pytest
import torch

from amity.models.attention import AttentionMetadata, as_cached, reference_paged_attention, widened
from amity.models.cpu_kernels import load_cpu_kernels

BLOCK_SIZE = 4
NUM_BLOCKS = 80
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 6, 2, 16
# (query heads, kv heads, head_dim): the kernel's vectorized path holds head_dim /
# 16 vectors per head and as many heads at a time as 16 registers allow (64: 4
# of the 6 heads, then 2); a head_dim of 24 takes its plain loops.
HEAD_SHAPES = [(6, 2, 16), (6, 1, 64), (4, 2, 24)]

# (cached tokens before the step, new tokens this step); the kernel scores keys 16
# at a time, and 41 or 35 keys end in partial groups of 16; it splits chunks into
# items of 32 rows (the chunk of 40); three fresh chunks of 20 sit side by side.
STEP = [(9, 1), (0, 1), (3, 1), (5, 7), (0, 20), (0, 20), (0, 20), (11, 18), (2, 16), (0, 3), (40, 1), (33, 2),
        (0, 40)]


def _build_step(dtype, heads=(NUM_HEADS, NUM_KV_HEADS, HEAD_DIM), cache_dtype=None):
    num_heads, num_kv_heads, head_dim = heads
    gen = torch.Generator().manual_seed(0)
    free = torch.randperm(NUM_BLOCKS, generator=gen).tolist()
    tables, slots, query_start, context_lens = [], [], [0], []
    for cached, new in STEP:
        total = cached + new
        table = [free.pop() for _ in range(-(-total // BLOCK_SIZE))]
        tables.append(table)
        slots += [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(cached, total)]
        query_start.append(query_start[-1] + new)
        context_lens.append(total)
    width = max(map(len, tables))
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots),
        query_start=torch.tensor(query_start),
        context_lens=torch.tensor(context_lens),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]))
    num_tokens = query_start[-1]
    shape = (NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, head_dim)
    # Cached K/V: random everywhere, so whatever a wrong slot reads is wrong.
    k_cache = as_cached(torch.randn(shape, generator=gen), cache_dtype or dtype)
    v_cache = as_cached(torch.randn(shape, generator=gen), cache_dtype or dtype)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    return q, k, v, k_cache, v_cache, meta, tables


def _dense(q, k, v, k_cache, v_cache, tables, scale):
    """The definition, written out in float64 on the cache as it is after the step's writes."""
    out = torch.empty(q.shape, dtype=torch.float64)
    num_heads, num_kv_heads, head_dim = q.shape[1], k_cache.shape[2], q.shape[2]
    group = num_heads // num_kv_heads
    flat_k = widened(k_cache, q).double().reshape(-1, num_kv_heads, head_dim)
    flat_v = widened(v_cache, q).double().reshape(-1, num_kv_heads, head_dim)
    token = 0
    for (cached, new), table in zip(STEP, tables):
        total = cached + new
        slots = torch.tensor([table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(total)])
        keys, values = flat_k[slots], flat_v[slots]  # [total, Hkv, D]
        for i in range(new):
            visible = cached + i + 1
            for h in range(num_heads):
                scores = keys[:visible, h // group] @ q[token, h].double() * scale
                out[token, h] = torch.softmax(scores, 0) @ values[:visible, h // group]
            token += 1
    return out


# A float32 model may keep a narrower cache (--kv-cache-dtype): the new K/V are rounded
# (or quantized, int8) as written, and attention reads them so; against the cache as
# it is after the writes, the float32 queries' results are float32-exact.
@pytest.mark.parametrize("heads", HEAD_SHAPES)
@pytest.mark.parametrize("dtype,cache_dtype,atol", [(torch.float32, None, 1e-5), (torch.bfloat16, None, 2e-2),
                                                    (torch.float32, torch.bfloat16, 1e-5),
                                                    (torch.float32, torch.float16, 1e-5),
                                                    (torch.float32, torch.int8, 1e-5)])
@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_paged_attention_matches_definition(impl, dtype, cache_dtype, atol, heads):
    load_cpu_kernels()
    q, k, v, k_cache, v_cache, meta, tables = _build_step(dtype, heads, cache_dtype)
    _, num_kv_heads, head_dim = heads
    scale = head_dim ** -0.5
    if impl == "kernel":
        out = torch.ops.amity.paged_attention(q, k, v, k_cache, v_cache, meta.slot_mapping,
                                              meta.query_start, meta.context_lens,
                                              meta.block_tables, scale)
    else:
        out = reference_paged_attention(q, k, v, k_cache, v_cache, meta, scale)
    # The step's new K/V went to their slots, as the cache keeps them (the kernel's
    # int8 rows are torch's round(x / scale), the reference's).
    row = k_cache.shape[-1]
    assert torch.equal(k_cache.reshape(-1, num_kv_heads, row)[meta.slot_mapping], as_cached(k, k_cache.dtype))
    assert torch.equal(v_cache.reshape(-1, num_kv_heads, row)[meta.slot_mapping], as_cached(v, v_cache.dtype))
    expected = _dense(q, k, v, k_cache, v_cache, tables, scale)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=0)


def test_fresh_chunks_side_by_side_get_the_bits_they_get_alone():
    load_cpu_kernels()
    q, k, v, k_cache, v_cache, meta, tables = _build_step(torch.float32)
    scale = HEAD_DIM ** -0.5

    def attend(rows, seqs, k_cache):
        starts = meta.query_start[seqs.start:seqs.stop + 1]
        return torch.ops.amity.paged_attention(q[rows], k[rows], v[rows], k_cache, v_cache.clone(),
                                               meta.slot_mapping[rows], starts - starts[0],
                                               meta.context_lens[seqs], meta.block_tables[seqs], scale)

    fresh = [s for s, chunk in enumerate(STEP) if chunk == (0, 20)]
    first, last = meta.query_start[fresh[0]].item(), meta.query_start[fresh[-1] + 1].item()
    together = attend(slice(first, last), slice(fresh[0], fresh[-1] + 1), k_cache.clone())
    for s in fresh:
        start = meta.query_start[s].item()
        alone = attend(slice(start, start + 20), slice(s, s + 1), k_cache.clone())
        assert torch.equal(together[start - first:start - first + 20], alone), s


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_decodes_side_by_side_get_the_bits_they_get_alone(cache_dtype):
    """Many decodes in one step go to the threads a sequence at a time, every KV head of
    it in one work item; one alone goes a head at a time: the same bits."""
    load_cpu_kernels()
    gen = torch.Generator().manual_seed(2)
    num_heads, num_kv_heads, head_dim = 6, 2, 64
    contexts = [60 + 2 * s for s in range(12)]  # enough key rows for both threads
    free = torch.randperm(NUM_BLOCKS * 4, generator=gen).tolist()
    tables = [[free.pop() for _ in range(-(-n // BLOCK_SIZE))] for n in contexts]
    width = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    slots = torch.tensor([t[(n - 1) // BLOCK_SIZE] * BLOCK_SIZE + (n - 1) % BLOCK_SIZE for t, n in zip(tables, contexts)])
    shape = (NUM_BLOCKS * 4, BLOCK_SIZE, num_kv_heads, head_dim)
    k_cache = as_cached(torch.randn(shape, generator=gen), cache_dtype)
    v_cache = as_cached(torch.randn(shape, generator=gen), cache_dtype)
    q = torch.randn(len(contexts), num_heads, head_dim, generator=gen)
    k = torch.randn(len(contexts), num_kv_heads, head_dim, generator=gen)
    v = torch.randn(len(contexts), num_kv_heads, head_dim, generator=gen)

    def attend(seqs):
        return torch.ops.amity.paged_attention(q[seqs], k[seqs], v[seqs], k_cache.clone(), v_cache.clone(),
                                               slots[seqs], torch.arange(len(seqs) + 1),
                                               torch.tensor(contexts)[seqs], block_tables[seqs], head_dim ** -0.5)

    together = attend(list(range(len(contexts))))
    for s in range(len(contexts)):
        assert torch.equal(together[s], attend([s])[0]), s


@pytest.mark.parametrize("tiles", [False, True])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_a_rows_bits_do_not_depend_on_its_chunk(cache_dtype, tiles):
    """Every query row is computed alone: a prompt attended whole, in chunks of any
    length (as chunked prefill, a prefix-cache hit or a recompute after preemption
    split it) or a row at a time gets the same bits; so do prompt rows on AMX tiles
    (`tile_rows`, a bfloat16 cache on a CPU with AMX; elsewhere the same loops)."""
    load_cpu_kernels()
    gen = torch.Generator().manual_seed(1)
    n, num_heads, num_kv_heads, head_dim = 70, 6, 2, 64
    q = torch.randn(n, num_heads, head_dim, generator=gen)
    k = torch.randn(n, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(n, num_kv_heads, head_dim, generator=gen)
    table = torch.randperm(NUM_BLOCKS, generator=gen)[:-(-n // BLOCK_SIZE)]
    positions = torch.arange(n)
    slots = table[positions // BLOCK_SIZE] * BLOCK_SIZE + positions % BLOCK_SIZE

    def attend(splits):
        k_cache = as_cached(torch.zeros(NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, head_dim), cache_dtype)
        v_cache = torch.zeros_like(k_cache)
        return torch.cat([torch.ops.amity.paged_attention(q[a:b], k[a:b], v[a:b], k_cache, v_cache, slots[a:b],
                                                          torch.tensor([0, b - a]), torch.tensor([b]),
                                                          table[None], head_dim ** -0.5,
                                                          torch.ones(b - a, dtype=torch.bool) if tiles else None)
                          for a, b in zip(splits, splits[1:])])

    whole = attend([0, n])
    for splits in ([0, 20, 21, 53, n], [0, 33, n], list(range(n + 1))):
        assert torch.equal(attend(splits), whole), splits


def test_prompt_rows_on_tiles_match_the_definition():
    """Rows that `tile_rows` marks (prompt rows under --prompt-tiles) go on AMX tiles
    where the cache is bfloat16: queries and probabilities rounded to bfloat16, sums
    in float32, so within bfloat16's rounding of the float64 definition; rows it
    leaves out keep the float32 loops' exact results. NaN and Inf in slots no
    sequence owns reach no output on either path."""
    load_cpu_kernels()
    heads = (6, 1, 64)
    q, k, v, k_cache, v_cache, meta, tables = _build_step(torch.float32, heads, torch.bfloat16)
    num_kv_heads, head_dim = heads[1:]
    owned = torch.zeros(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
    for (cached, new), table in zip(STEP, tables):
        owned[[table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(cached + new)]] = True
    poison = torch.tensor([float("nan"), float("inf")]).repeat(NUM_BLOCKS * BLOCK_SIZE // 2)
    for cache in (k_cache, v_cache):
        cache.view(-1, num_kv_heads, head_dim)[~owned] = poison[~owned][:, None, None].to(cache.dtype)
    tile_rows = torch.rand(q.shape[0], generator=torch.Generator().manual_seed(2)) < 0.7
    scale = head_dim ** -0.5
    out = torch.ops.amity.paged_attention(q, k, v, k_cache, v_cache, meta.slot_mapping, meta.query_start,
                                          meta.context_lens, meta.block_tables, scale, tile_rows)
    expected = _dense(q, k, v, k_cache, v_cache, tables, scale)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=0)
    torch.testing.assert_close(out[~tile_rows].double(), expected[~tile_rows], atol=1e-5, rtol=0)


def test_kernel_takes_strided_query():
    """q arrives as a view of the fused qkv projection, not contiguous."""
    load_cpu_kernels()
    q, k, v, k_cache, v_cache, meta, tables = _build_step(torch.float32)
    wide = torch.cat([q, torch.zeros_like(q)], dim=-1)[..., :HEAD_DIM]
    assert not wide.is_contiguous()
    scale = HEAD_DIM ** -0.5
    out = torch.ops.amity.paged_attention(wide, k, v, k_cache, v_cache, meta.slot_mapping,
                                          meta.query_start, meta.context_lens, meta.block_tables, scale)
    torch.testing.assert_close(out.double(), _dense(q, k, v, k_cache, v_cache, tables, scale),
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.int8])
@pytest.mark.parametrize("impl", ["kernel", "reference"])
def test_unused_slots_never_reach_an_output(impl, cache_dtype):
    """Issue 13 (defect 8): a NaN or Inf left in a slot no sequence of the step owns
    (a freed block, the tail of a last block, the padding of a block table) must not
    reach any output: masking the scores alone still multiplies 0 by NaN. In an int8
    cache the poison is in the rows' scales."""
    load_cpu_kernels()
    q, k, v, k_cache, v_cache, meta, tables = _build_step(torch.float32, cache_dtype=cache_dtype)
    owned = torch.zeros(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
    for (cached, new), table in zip(STEP, tables):
        owned[[table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(cached + new)]] = True
    poison = torch.tensor([float("nan"), float("inf")]).repeat(NUM_BLOCKS * BLOCK_SIZE // 2)
    for cache in (k_cache, v_cache):
        flat = cache.view(-1, NUM_KV_HEADS, cache.shape[-1])
        if cache_dtype == torch.int8:
            scales = flat[..., HEAD_DIM:].view(torch.float32)  # [slots, heads, groups], the same memory
            scales[~owned] = poison[~owned][:, None, None]
        else:
            flat[~owned] = poison[~owned][:, None, None]
    scale = HEAD_DIM ** -0.5
    if impl == "kernel":
        out = torch.ops.amity.paged_attention(q, k, v, k_cache, v_cache, meta.slot_mapping,
                                              meta.query_start, meta.context_lens,
                                              meta.block_tables, scale)
    else:
        out = reference_paged_attention(q, k, v, k_cache, v_cache, meta, scale)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), _dense(q, k, v, k_cache, v_cache, tables, scale),
                               atol=1e-5, rtol=0)
