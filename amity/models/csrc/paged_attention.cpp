// Paged attention on the CPU, reading K/V where they lie in the block pool.
//
// The PyTorch path (attention.py) gathers every sequence's context out of the pool
// before each layer's attention: at 32 decodes that copy is a third of a step.
// This kernel walks each sequence's block table instead. One rule covers every
// sequence of a step: query token i of a chunk of q_len tokens, with ctx_len
// tokens in context after this step, sees keys 0 .. ctx_len - q_len + i.
// Each query row is computed alone, by the same code, whether it is a decode or
// one row of a long prefill chunk: how a prompt is chunked, batched, cached or
// recomputed never changes its bits (ATen's SDPA gives a row other bits in
// another chunk), and a row reads only the keys it sees. The rows of a work item
// share each key's loading and widening (a key read once serves up to 32 rows of
// 1-9 heads), but not their arithmetic.

#include <torch/extension.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <omp.h>

namespace amity {
at::Tensor contiguous_as(const at::Tensor& t, at::ScalarType dtype);  // packed_linear.cpp
bool amx_tiles();                                                     // amx.cpp
void amx_configure(int count, const uint8_t* rows, const uint16_t* colsb);  // amx.cpp
}  // namespace amity
using amity::contiguous_as;

namespace {

// A thread's unit of work: one KV head of up to this many query rows of one
// sequence, so that a long prompt's rows spread over the threads too.
constexpr int64_t kRowsPerItem = 32;

struct Rows {
  int64_t seq, first, count;  // the sequence's query rows first .. first + count - 1
};

// The loops below are written so that the compiler vectorizes them (omp simd):
// a K/V row is widened to float once, then every query head of its group uses it.
// Returns a float view of n values: float rows are used where they lie, narrower
// types are widened into `scratch`.
inline const float* widen(const float* src, float* /*scratch*/, int64_t /*n*/) { return src; }

inline const float* widen(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) {
    const uint32_t wide = static_cast<uint32_t>(bits[d]) << 16;
    float f;
    std::memcpy(&f, &wide, sizeof(f));
    dst[d] = f;
  }
  return dst;
}

inline const float* widen(const c10::Half* src, float* dst, int64_t n) {
  for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<float>(src[d]);
  return dst;
}

// An int8 cache keeps each head's row as head_dim values, then a float32 scale for
// each group of kGroup of them (attention.py): a value is itself times its group's.
constexpr int64_t kGroup = 32;

inline int64_t num_groups(int64_t head_dim) { return (head_dim + kGroup - 1) / kGroup; }

inline float group_scale(const int8_t* row, int64_t head_dim, int64_t group) {
  float scale;
  std::memcpy(&scale, row + head_dim + group * static_cast<int64_t>(sizeof(float)), sizeof(scale));
  return scale;
}

inline const float* widen(const int8_t* src, float* dst, int64_t n) {
  for (int64_t g = 0; g < num_groups(n); ++g) {
    const float scale = group_scale(src, n, g);
    const int64_t end = std::min(n, (g + 1) * kGroup);
#pragma omp simd
    for (int64_t d = g * kGroup; d < end; ++d) dst[d] = static_cast<float>(src[d]) * scale;
  }
  return dst;
}

// A head's K or V row in the cache, in elements: head_dim, and the scales' bytes for int8.
template <typename cache_t>
constexpr int64_t row_elements(int64_t head_dim) {
  return head_dim + (std::is_same_v<cache_t, int8_t> ? num_groups(head_dim) * static_cast<int64_t>(sizeof(float)) : 0);
}

// The dot product of a query and a key row. gcc's own reduction of an omp simd
// loop ends in a serial chain of scalar adds; the AVX-512 form sums in a tree.
inline float dot(const float* a, const float* b, int64_t n) {
#if defined(__AVX512F__)
  if (n % 16 == 0) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t d = 0; d < n; d += 16)
      acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
    return _mm512_reduce_add_ps(acc);
  }
#endif
  float sum = 0.f;
  for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

// Asks for one head's rows of a block ahead of their use: a core's demand misses
// alone stream K/V at a fraction of the memory bandwidth on this kind of machine.
template <typename scalar_t>
inline void prefetch_block(const scalar_t* first_row, int64_t block_size, int64_t slot_stride,
                           int64_t head_dim) {
#if defined(__AVX512F__)
  const int64_t row_bytes = head_dim * static_cast<int64_t>(sizeof(scalar_t));
  for (int64_t t = 0; t < block_size; ++t) {
    const char* row = reinterpret_cast<const char*>(first_row + t * slot_stride);
    for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
  }
#endif
}

// Calls visit(j, row) for the keys j = 0 .. num_keys - 1 of one sequence, `row`
// pointing at one head's K or V of key j in the pool, and prefetches each next
// block of the table while the current one is used.
template <typename scalar_t, typename Visit>
inline void walk_context(const scalar_t* cache, const int64_t* table, int64_t num_keys,
                         int64_t block_size, int64_t slot_stride, int64_t head_offset,
                         int64_t head_dim, Visit visit) {
  for (int64_t j = 0, slot = 0; j < num_keys; ++j, ++slot) {
    if (j % block_size == 0) {
      slot = table[j / block_size] * block_size;
      if (j + block_size < num_keys)
        prefetch_block(cache + table[j / block_size + 1] * block_size * slot_stride + head_offset,
                       block_size, slot_stride, head_dim);
    }
    visit(j, cache + slot * slot_stride + head_offset);
  }
}

// exp(x) for the x <= 0 of a max-subtracted softmax: Cephes' expf (range
// reduction by ln 2, degree-6 polynomial; about 1e-7 relative error), in a form
// that vectorizes, which std::exp does not without -ffast-math.
#pragma omp declare simd
inline float exp_nonpositive(float x) {
  x = x < -87.f ? -87.f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
// The in-place path for head_dim = 16 * NV, NV <= 16, in AVX-512 registers.
//
// Scores: each key row is multiplied into lane-wise partial sums, and 16 keys'
// partials are folded into one vector of 16 scores at once (`fold16`), where a
// horizontal sum per key costs several times more. Softmax: the exp below, 16
// keys at a time. Values: each query head's output stays in registers across
// the keys. Every key of every query goes through the same code, in blocks of 16
// fixed by its position in the sequence, so a query's result does not depend on
// the rest of its batch.

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m512i halves = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(halves, 16));
}
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// out[j] = sum of the 16 lanes of v[j], for j = 0..15: pairs of 128-bit lanes,
// then of 64-bit halves, then of floats are added across vectors, which leaves
// key 4m + k in lane 4k + m; one permute puts them in order.
inline __m512 fold16(const __m512* v) {
  __m512 u[8], w[4], x[2];
  for (int p = 0; p < 8; ++p)
    u[p] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * p], v[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int r = 0; r < 4; ++r)
    w[r] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * r], u[2 * r + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u[2 * r], u[2 * r + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  for (int t = 0; t < 2; ++t)
    x[t] = _mm512_add_ps(_mm512_unpacklo_ps(w[2 * t], w[2 * t + 1]), _mm512_unpackhi_ps(w[2 * t], w[2 * t + 1]));
  const __m512 y = _mm512_add_ps(_mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_ps(x[0], x[1], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), y);
}

// exp_nonpositive, 16 lanes at a time (the scaling by 2^n is one scalef).
inline __m512 exp16_nonpositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

constexpr int kMaxVectorHeadDim = 256;
// A block of rows keeps every row's scores (each row's softmax needs all of its
// own): rows per pass are capped so that their scores stay within ~1 MiB.
constexpr int64_t kMostScoreFloats = 256 << 10;

// One head's K or V row of key j0 + jj in the pool (key j0's for jj >= count: a
// lane no query uses). At the first key of a block, prefetches the table's next
// block.
template <typename cache_t>
inline const cache_t* key_row(const cache_t* cache, const int64_t* table, int64_t j0, int64_t jj, int64_t count,
                              int64_t num_keys, int64_t block_size, int64_t slot_stride, int64_t head_offset,
                              int64_t head_dim) {
  const int64_t j = j0 + (jj < count ? jj : 0);
  if (jj < count && j % block_size == 0 && j + block_size < num_keys)
    prefetch_block(cache + table[j / block_size + 1] * block_size * slot_stride + head_offset, block_size,
                   slot_stride, head_dim);
  return cache + (table[j / block_size] * block_size + j % block_size) * slot_stride + head_offset;
}

// Keys j0 .. j0 + count - 1 (count <= 16) as key_row gives them, into rows[0 .. 16).
template <typename cache_t>
inline void key_rows(const cache_t* cache, const int64_t* table, int64_t j0, int64_t count, int64_t num_keys,
                     int64_t block_size, int64_t slot_stride, int64_t head_offset, int64_t head_dim,
                     const cache_t** rows) {
  for (int64_t jj = 0; jj < 16; ++jj)
    rows[jj] = key_row(cache, table, j0, jj, count, num_keys, block_size, slot_stride, head_offset, head_dim);
}

// The same 16 rows widened to float, into rows[0 .. 16) of 16 * NV floats, in one
// loop (key_rows' pointer array first is measurably slower for decodes).
template <typename cache_t, int NV>
inline void widen_keys(const cache_t* cache, const int64_t* table, int64_t j0, int64_t count, int64_t num_keys,
                       int64_t block_size, int64_t slot_stride, int64_t head_offset, float* rows) {
  constexpr int D = 16 * NV;
  for (int64_t jj = 0; jj < 16; ++jj) {
    const cache_t* row = key_row(cache, table, j0, jj, count, num_keys, block_size, slot_stride, head_offset,
                                 row_elements<cache_t>(D));
    if constexpr (std::is_same_v<cache_t, int8_t>) {
      for (int v = 0; v < NV; ++v) {  // a vector's 16 values lie in one group
        const __m512 scale = _mm512_set1_ps(group_scale(row, D, 16 * v / kGroup));
        const __m512i wide = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * v)));
        _mm512_storeu_ps(rows + jj * D + 16 * v, _mm512_mul_ps(_mm512_cvtepi32_ps(wide), scale));
      }
    } else {
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(rows + jj * D + 16 * v, load16(row + 16 * v));
    }
  }
}

// Each row's softmax over its own keys, in place: row r (of num_rows, each with
// `group` heads, `stride` floats apart) sees first_keys + r keys; its exps, zeros
// past its keys up to a multiple of 16, and 1 / their sum in inv_sum.
inline void softmax_rows(float* scores, int64_t num_rows, int64_t group, int64_t first_keys, int64_t stride,
                         float* inv_sum) {
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t num_keys = first_keys + r, padded = (num_keys + 15) / 16 * 16;
    const __mmask16 tail = static_cast<__mmask16>((1u << (num_keys - (padded - 16))) - 1);
    for (int64_t g = 0; g < group; ++g) {
      float* sc = scores + (r * group + g) * stride;
      __m512 top = _mm512_set1_ps(-INFINITY);
      for (int64_t j0 = 0; j0 < padded; j0 += 16)
        top = _mm512_max_ps(top, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), j0 + 16 < padded ? 0xFFFF : tail, sc + j0));
      const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(top));
      __m512 sum = _mm512_setzero_ps();
      for (int64_t j0 = 0; j0 < padded; j0 += 16) {
        const __m512 e = _mm512_maskz_mov_ps(j0 + 16 < padded ? 0xFFFF : tail,
                                             exp16_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(sc + j0), max)));
        _mm512_storeu_ps(sc + j0, e);
        sum = _mm512_add_ps(sum, e);
      }
      inv_sum[r * group + g] = 1.f / _mm512_reduce_add_ps(sum);
    }
  }
}

// out's rows (row r's heads at out + r * out_row_stride, out_head_stride apart) =
// acc_rows (D floats each) times each head's inv_sum, in out's type.
template <typename scalar_t, int D>
inline void write_rows(const float* acc_rows, const float* inv_sum, int64_t num_rows, int64_t group, scalar_t* out,
                       int64_t out_row_stride, int64_t out_head_stride) {
  for (int64_t r = 0; r < num_rows; ++r)
    for (int64_t g = 0; g < group; ++g) {
      const __m512 inv = _mm512_set1_ps(inv_sum[r * group + g]);
      const float* acc_row = acc_rows + (r * group + g) * D;
      alignas(64) float row[D];
      for (int v = 0; v < D / 16; ++v)
        _mm512_storeu_ps(row + 16 * v, _mm512_mul_ps(_mm512_loadu_ps(acc_row + 16 * v), inv));
      scalar_t* dst = out + r * out_row_stride + g * out_head_stride;
      for (int d = 0; d < D; ++d) dst[d] = static_cast<scalar_t>(row[d]);
    }
}

// Query rows r = 0 .. num_rows - 1 of one sequence against their kv head's keys,
// row r seeing keys 0 .. first_keys + r - 1, for its `group` query heads: queries
// [num_rows][group][16 * NV] (scaled). Each 16 keys (and values) are widened once
// for every row and head; a row's arithmetic is the same whatever the block, so
// its bits are those it gets alone. Scratch: scores [num_rows * group][stride],
// stride = the most keys rounded up to 16; inv_sum [num_rows * group]; acc_rows
// [num_rows * group][16 * NV]; block_rows [16][16 * NV]. Writes as write_rows.
template <typename scalar_t, typename cache_t, int NV>
void attend_rows_vectorized(const float* queries, int64_t num_rows, int64_t group, int64_t first_keys,
                            const cache_t* k_cache, const cache_t* v_cache, const int64_t* table,
                            int64_t block_size, int64_t slot_stride, int64_t head_offset, float* scores,
                            float* inv_sum, float* acc_rows, float* block_rows, scalar_t* out,
                            int64_t out_row_stride, int64_t out_head_stride) {
  constexpr int D = 16 * NV;
  const int64_t most_keys = first_keys + num_rows - 1;
  const int64_t stride = (most_keys + 15) / 16 * 16;
  // Scores, 16 keys at a time: the rows that see key j0 are r >= j0 - first_keys + 1.
  for (int64_t j0 = 0; j0 < most_keys; j0 += 16) {
    widen_keys<cache_t, NV>(k_cache, table, j0, std::min<int64_t>(16, most_keys - j0), most_keys, block_size,
                            slot_stride, head_offset, block_rows);
    for (int64_t r = std::max<int64_t>(0, j0 - first_keys + 1); r < num_rows; ++r)
      for (int64_t g = 0; g < group; ++g) {
        const float* query = queries + (r * group + g) * D;
        __m512 q[NV], partial[16];
        for (int v = 0; v < NV; ++v) q[v] = _mm512_loadu_ps(query + 16 * v);
        for (int jj = 0; jj < 16; ++jj) {
          const float* key = block_rows + jj * D;
          __m512 acc = _mm512_mul_ps(q[0], _mm512_loadu_ps(key));
          for (int v = 1; v < NV; ++v) acc = _mm512_fmadd_ps(q[v], _mm512_loadu_ps(key + 16 * v), acc);
          partial[jj] = acc;
        }
        _mm512_storeu_ps(scores + (r * group + g) * stride + j0, fold16(partial));
      }
  }
  softmax_rows(scores, num_rows, group, first_keys, stride, inv_sum);
  // Values: each row's heads accumulate in key order, as many heads at a time as
  // 16 registers hold, kept in acc_rows between blocks of 16 values.
  constexpr int GC = NV >= 16 ? 1 : 16 / NV;
  std::fill(acc_rows, acc_rows + num_rows * group * D, 0.f);
  for (int64_t j0 = 0; j0 < most_keys; j0 += 16) {
    widen_keys<cache_t, NV>(v_cache, table, j0, std::min<int64_t>(16, most_keys - j0), most_keys, block_size,
                            slot_stride, head_offset, block_rows);
    for (int64_t r = std::max<int64_t>(0, j0 - first_keys + 1); r < num_rows; ++r) {
      const int64_t count = std::min<int64_t>(16, first_keys + r - j0);
      for (int64_t g0 = 0; g0 < group; g0 += GC) {
        const int64_t gn = std::min<int64_t>(GC, group - g0);
        float* acc_row = acc_rows + (r * group + g0) * D;
        const float* p_row = scores + (r * group + g0) * stride + j0;
        __m512 acc[GC][NV];
        for (int g = 0; g < GC; ++g)
          if (g < gn)
            for (int v = 0; v < NV; ++v) acc[g][v] = _mm512_loadu_ps(acc_row + g * D + 16 * v);
        for (int64_t jj = 0; jj < count; ++jj) {
          __m512 vr[NV];
          for (int v = 0; v < NV; ++v) vr[v] = _mm512_loadu_ps(block_rows + jj * D + 16 * v);
          for (int g = 0; g < GC; ++g)
            if (g < gn) {
              const __m512 p = _mm512_set1_ps(p_row[g * stride + jj]);
              for (int v = 0; v < NV; ++v) acc[g][v] = _mm512_fmadd_ps(p, vr[v], acc[g][v]);
            }
        }
        for (int g = 0; g < GC; ++g)
          if (g < gn)
            for (int v = 0; v < NV; ++v) _mm512_storeu_ps(acc_row + g * D + 16 * v, acc[g][v]);
      }
    }
  }
  write_rows<scalar_t, D>(acc_rows, inv_sum, num_rows, group, out, out_row_stride, out_head_stride);
}
#endif

#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AMX_TILE__) && defined(__AMX_BF16__) && \
    defined(__AVX512BF16__)
#define AMITY_ATTENTION_TILES 1
// 16 rows of 16 32-bit words, transposed: out[c * 16 + r] = rows[r][c].
inline void transpose16(const uint32_t* const* rows, uint32_t* out) {
  __m512i r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(rows[i]);
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // r[4i + k], 128-bit lane L: column 4L + k of rows 4i .. 4i + 3
  for (int i = 0; i < 4; ++i) {
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i x0 = _mm512_shuffle_i32x4(r[k], r[4 + k], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i x1 = _mm512_shuffle_i32x4(r[k], r[4 + k], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i y0 = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i y1 = _mm512_shuffle_i32x4(r[8 + k], r[12 + k], _MM_SHUFFLE(3, 2, 3, 2));
    _mm512_storeu_si512(out + (0 + k) * 16, _mm512_shuffle_i32x4(x0, y0, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_storeu_si512(out + (4 + k) * 16, _mm512_shuffle_i32x4(x0, y0, _MM_SHUFFLE(3, 1, 3, 1)));
    _mm512_storeu_si512(out + (8 + k) * 16, _mm512_shuffle_i32x4(x1, y1, _MM_SHUFFLE(2, 0, 2, 0)));
    _mm512_storeu_si512(out + (12 + k) * 16, _mm512_shuffle_i32x4(x1, y1, _MM_SHUFFLE(3, 1, 3, 1)));
  }
}

// Every tile 16 rows of 64 bytes: scores use 0 (sums), 4 (queries), 6 (keys);
// values 0-3 (sums of 16 dims each), 4 (probabilities), 5 (values).
void configure_attention_tiles() {
  const uint8_t rows[8] = {16, 16, 16, 16, 16, 16, 16, 16};
  const uint16_t colsb[8] = {64, 64, 64, 64, 64, 64, 64, 64};
  amity::amx_configure(8, rows, colsb);
}

// The tile path's own scratch; scores and sums use the thread's buffers.
struct TileScratch {
  std::vector<uint16_t> q16, probs;  // bfloat16 bits
  std::vector<uint32_t> pairs, keys_t;
};

// A bfloat16 cache on a CPU with AMX: the rows of attend_rows_vectorized on
// bfloat16 tiles. Queries (rounded to bfloat16, nearest even) times keys as the
// cache holds them, 16 query heads x 16 keys a tile step; each row's softmax in
// float32 as there; probabilities rounded to bfloat16 times values, 16 heads x 16
// dims over 32 keys a step, the sums kept in the tiles across the keys. A tile's
// row never mixes with its other rows, keys go in blocks fixed by position, and a
// row's probabilities past its keys are exact zeros: its bits are those it gets
// alone, in any chunk. The products are bfloat16's (as llama.cpp's and vLLM's CPU
// attention multiply in 16 bits), the sums float32.
template <typename scalar_t, int NB>  // head_dim = 32 * NB
void attend_rows_tiles(const float* queries, int64_t num_rows, int64_t group, int64_t first_keys,
                       const c10::BFloat16* k_cache, const c10::BFloat16* v_cache, const int64_t* table,
                       int64_t block_size, int64_t slot_stride, int64_t head_offset,
                       std::vector<float>& scores, float* inv_sum, float* acc_rows, TileScratch& s, scalar_t* out,
                       int64_t out_row_stride, int64_t out_head_stride) {
  constexpr int D = 32 * NB, NV = 2 * NB;
  const int64_t M = num_rows * group, num_tiles = (M + 15) / 16;  // query heads, tiles of 16 of them
  const int64_t most_keys = first_keys + num_rows - 1;
  const int64_t stride = (most_keys + 31) / 32 * 32;
  s.q16.resize(num_tiles * 16 * D);
  scores.resize(num_tiles * 16 * stride);
  s.probs.resize(num_tiles * 16 * stride);
  s.pairs.resize(stride / 2 * D);
  for (int64_t i = 0; i < num_tiles * 16; ++i)
    for (int b = 0; b < NB; ++b) {
      const __m512i bits = i < M ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(queries + i * D + 32 * b + 16),
                                                               _mm512_loadu_ps(queries + i * D + 32 * b))
                                 : _mm512_setzero_si512();
      _mm512_storeu_si512(s.q16.data() + i * D + 32 * b, bits);
    }
  // Scores: every 16 keys' K transposed to pairs of dims x keys first; then per tile of
  // query heads (its bfloat16 queries held in tiles 4 and 5 where head_dim is 64 or
  // less), a product per 16 keys.
  const int64_t key_blocks = (most_keys + 15) / 16;
  s.keys_t.resize(key_blocks * NB * 256);
  const c10::BFloat16* rows[16];
  for (int64_t kb = 0; kb < key_blocks; ++kb) {
    const int64_t j0 = kb * 16;
    key_rows(k_cache, table, j0, std::min<int64_t>(16, most_keys - j0), most_keys, block_size, slot_stride,
             head_offset, D, rows);
    for (int b = 0; b < NB; ++b) {
      const uint32_t* words[16];
      for (int jj = 0; jj < 16; ++jj) words[jj] = reinterpret_cast<const uint32_t*>(rows[jj]) + 16 * b;
      transpose16(words, s.keys_t.data() + (kb * NB + b) * 256);
    }
  }
  __asm__ volatile("" ::: "memory");  // written before the tiles load them (block_linear.cpp)
  for (int64_t tile = 0; tile < num_tiles; ++tile) {
    const uint16_t* q = s.q16.data() + tile * 16 * D;
    const int64_t last_head = std::min<int64_t>(M, (tile + 1) * 16) - 1;
    const int64_t blocks = (first_keys + last_head / group + 15) / 16;  // the tile's longest row's keys
    if constexpr (NB <= 2) {
      _tile_loadd(4, q, D * 2);
      if constexpr (NB == 2) _tile_loadd(5, q + 32, D * 2);
    }
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const uint32_t* kt = s.keys_t.data() + kb * NB * 256;
      _tile_zero(0);
      if constexpr (NB <= 2) {
        _tile_loadd(6, kt, 64);
        _tile_dpbf16ps(0, 4, 6);
        if constexpr (NB == 2) {
          _tile_loadd(7, kt + 256, 64);
          _tile_dpbf16ps(0, 5, 7);
        }
      } else {
        for (int b = 0; b < NB; ++b) {
          _tile_loadd(4, q + 32 * b, D * 2);
          _tile_loadd(6, kt + b * 256, 64);
          _tile_dpbf16ps(0, 4, 6);
        }
      }
      _tile_stored(0, scores.data() + tile * 16 * stride + kb * 16, stride * 4);
    }
  }
  softmax_rows(scores.data(), num_rows, group, first_keys, stride, inv_sum);
  // Probabilities in bfloat16, zeros past each row's keys (and in the padding heads).
  for (int64_t i = 0; i < num_tiles * 16; ++i) {
    const int64_t padded = i < M ? (first_keys + i / group + 15) / 16 * 16 : 0;
    uint16_t* p = s.probs.data() + i * stride;
    for (int64_t j0 = 0; j0 < padded; j0 += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + j0),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(scores.data() + i * stride + j0)));
    std::fill(p + padded, p + stride, uint16_t{0});
  }
  // Values as pairs of keys: word d of pair t holds dim d of keys 2t and 2t + 1.
  for (int64_t j0 = 0; j0 < stride; j0 += 16) {
    if (j0 < most_keys)
      key_rows(v_cache, table, j0, std::min<int64_t>(16, most_keys - j0), most_keys, block_size, slot_stride,
               head_offset, D, rows);
    for (int64_t t = 0; t < 8; ++t)
      for (int v = 0; v < NV; ++v) {
        uint32_t* dst = s.pairs.data() + (j0 / 2 + t) * D + 16 * v;
        if (j0 >= most_keys) {
          _mm512_storeu_si512(dst, _mm512_setzero_si512());
          continue;
        }
        const auto dims = [&](int64_t key) {  // 16 dims of one key, each widened to 32 bits
          return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows[key] + 16 * v)));
        };
        const __m512i even = dims(2 * t), odd = dims(2 * t + 1);
        _mm512_storeu_si512(dst, _mm512_or_si512(even, _mm512_slli_epi32(odd, 16)));
      }
  }
  __asm__ volatile("" ::: "memory");
  for (int64_t tile = 0; tile < num_tiles; ++tile) {
    const int64_t last_head = std::min<int64_t>(M, (tile + 1) * 16) - 1;
    const int64_t steps = (first_keys + last_head / group + 31) / 32;  // of 32 keys, for the tile's longest row
    const uint16_t* p = s.probs.data() + tile * 16 * stride;
    for (int c0 = 0; c0 < NV; c0 += 4) {  // dims 16 * c0 .. in up to four sum tiles
      const int nc = std::min(4, NV - c0);
      _tile_zero(0);
      if (nc > 1) _tile_zero(1);
      if (nc > 2) _tile_zero(2);
      if (nc > 3) _tile_zero(3);
      for (int64_t step = 0; step < steps; ++step) {
        _tile_loadd(4, p + 32 * step, stride * 2);
        const uint32_t* vp = s.pairs.data() + 16 * step * D + 16 * c0;
        _tile_loadd(5, vp, D * 4);
        _tile_dpbf16ps(0, 4, 5);
        if (nc > 1) { _tile_loadd(5, vp + 16, D * 4); _tile_dpbf16ps(1, 4, 5); }
        if (nc > 2) { _tile_loadd(5, vp + 32, D * 4); _tile_dpbf16ps(2, 4, 5); }
        if (nc > 3) { _tile_loadd(5, vp + 48, D * 4); _tile_dpbf16ps(3, 4, 5); }
      }
      float* a = acc_rows + tile * 16 * D + 16 * c0;
      _tile_stored(0, a, D * 4);
      if (nc > 1) _tile_stored(1, a + 16, D * 4);
      if (nc > 2) _tile_stored(2, a + 32, D * 4);
      if (nc > 3) _tile_stored(3, a + 48, D * 4);
    }
  }
  write_rows<scalar_t, D>(acc_rows, inv_sum, num_rows, group, out, out_row_stride, out_head_stride);
}
#endif

// scalar_t: q's and out's type; cache_t: the KV cache's (a float32 model may keep
// its K/V in bfloat16, widened here as they are read).
template <typename scalar_t, typename cache_t>
void attend_in_place(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const int64_t* query_start, const int64_t* context_lens,
                     const at::Tensor& block_tables, const std::vector<Rows>& pieces,
                     double scale, const bool* tiled, at::Tensor& out) {
  const int64_t num_heads = q.size(1), head_dim = q.size(2);
  const int64_t num_kv_heads = k_cache.size(2), block_size = k_cache.size(1);
  const int64_t group = num_heads / num_kv_heads;
  const int64_t max_blocks = block_tables.size(1);
  const scalar_t* q_ptr = q.data_ptr<scalar_t>();
  const cache_t* k_ptr = k_cache.data_ptr<cache_t>();
  const cache_t* v_ptr = v_cache.data_ptr<cache_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  scalar_t* out_ptr = out.data_ptr<scalar_t>();
  const int64_t row_elems = row_elements<cache_t>(head_dim), slot_stride = num_kv_heads * row_elems;
  TORCH_CHECK(k_cache.size(3) == row_elems, "amity::paged_attention: the cache's rows hold ", k_cache.size(3),
              " elements, not ", row_elems, " for head_dim ", head_dim);
  const float scale_f = static_cast<float>(scale);

  // Threads pay off past a few hundred key rows (times KV heads): a single stream's
  // decode reads its K and V from memory, the step's weights having evicted them,
  // and one core alone waits on those misses; a handful of rows stays on one thread
  // rather than wake the pool for microseconds of work.
  int64_t num_key_rows = 0, most_key_rows = 0;
  for (const Rows& piece : pieces) {
    num_key_rows += context_lens[piece.seq] * piece.count;
    most_key_rows = std::max(most_key_rows, context_lens[piece.seq] * piece.count);
  }
  // Items are handed out one at a time (dynamic): contexts differ in length, and a
  // thread that loses its core to the server's event loop leaves its items to the other.
  const bool parallel = num_key_rows * num_kv_heads >= 256;
  // An item is one KV head of a piece, or all of them where no piece is more than half
  // a thread's share: then one core reads each key's whole slot row (every head's
  // K or V, one stretch of memory) rather than two cores each fetching the lines
  // around their own heads' (5-9% of a 32-stream decode step).
  const int64_t threads = parallel ? omp_get_max_threads() : 1;
  const int64_t heads_per_item = most_key_rows * 2 * threads <= num_key_rows ? num_kv_heads : 1;
  const int64_t items_per_piece = num_kv_heads / heads_per_item;
  const int64_t num_items = static_cast<int64_t>(pieces.size()) * items_per_piece;
#ifdef AMITY_ATTENTION_TILES
  const bool tiles = tiled != nullptr && std::is_same_v<cache_t, c10::BFloat16> && head_dim % 32 == 0 &&
                     head_dim <= kMaxVectorHeadDim && amity::amx_tiles();
#else
  const bool tiles = false;
#endif
#pragma omp parallel if (parallel)
  {
#ifdef AMITY_ATTENTION_TILES
    TileScratch tile_scratch;
    if (tiles) configure_attention_tiles();
#endif
    // One item's query rows, scaled: [row][head of the group][head_dim]; sums alike (32 x group
    // rows: whole tiles of 16 for the tile path too).
    std::vector<float> queries(kRowsPerItem * group * head_dim), acc(kRowsPerItem * group * head_dim);
    std::vector<float> row(head_dim), block_rows(16 * head_dim), scores, inv_sum(kRowsPerItem * group);
#pragma omp for schedule(dynamic, 1)
    for (int64_t item = 0; item < num_items; ++item) {
      const Rows& piece = pieces[item / items_per_piece];
      const int64_t first_head = item % items_per_piece * heads_per_item;
      for (int64_t kv_head = first_head; kv_head < first_head + heads_per_item; ++kv_head) {
        const int64_t s = piece.seq;
        const int64_t start = query_start[s], q_len = query_start[s + 1] - start;
        const int64_t ctx_len = context_lens[s];
        const int64_t* table = tables + s * max_blocks;
        for (int64_t r = 0; r < piece.count; ++r)
          for (int64_t g = 0; g < group; ++g) {
            float* qg = queries.data() + (r * group + g) * head_dim;
            const float* src = widen(q_ptr + ((start + piece.first + r) * num_heads + kv_head * group + g) * head_dim,
                                     row.data(), head_dim);
  #pragma omp simd
            for (int64_t d = 0; d < head_dim; ++d) qg[d] = src[d] * scale_f;
          }
        // Query row i of the sequence's chunk sees keys 0 .. ctx_len - q_len + i.
        const int64_t first_keys = ctx_len - q_len + piece.first + 1;
  #if defined(__AVX512F__) && defined(__AVX512DQ__)
        if (head_dim % 16 == 0 && head_dim <= kMaxVectorHeadDim) {
          const int64_t stride = (first_keys + piece.count - 1 + 15) / 16 * 16;
          const int64_t per_pass = std::clamp<int64_t>(kMostScoreFloats / (group * stride), 1, piece.count);
          // Passes of up to per_pass rows that take one path: tiles for the rows tile_rows
          // marks (where the cache and the CPU allow), the vector loops for the rest.
          const auto on_tiles = [&](int64_t r) { return tiles && tiled[start + piece.first + r]; };
          for (int64_t r0 = 0, n = 1; r0 < piece.count; r0 += n, n = 1) {
            while (n < per_pass && r0 + n < piece.count && on_tiles(r0 + n) == on_tiles(r0)) ++n;
            scalar_t* out_rows = out_ptr + ((start + piece.first + r0) * num_heads + kv_head * group) * head_dim;
  #ifdef AMITY_ATTENTION_TILES
            if constexpr (std::is_same_v<cache_t, c10::BFloat16>) {
              if (on_tiles(r0)) {
                switch (head_dim / 32) {
  #define AMITY_NB(NB) case NB: attend_rows_tiles<scalar_t, NB>(queries.data() + r0 * group * head_dim, n, group, \
                first_keys + r0, k_ptr, v_ptr, table, block_size, slot_stride, kv_head * row_elems, scores, \
                inv_sum.data(), acc.data(), tile_scratch, out_rows, num_heads * head_dim, head_dim); break;
                  AMITY_NB(1) AMITY_NB(2) AMITY_NB(3) AMITY_NB(4) AMITY_NB(5) AMITY_NB(6) AMITY_NB(7) AMITY_NB(8)
  #undef AMITY_NB
                }
                continue;
              }
            }
  #endif
            scores.resize(n * group * stride);
            switch (head_dim / 16) {
  #define AMITY_NV(NV) case NV: attend_rows_vectorized<scalar_t, cache_t, NV>(queries.data() + r0 * group * head_dim, \
                n, group, first_keys + r0, k_ptr, v_ptr, table, block_size, slot_stride, kv_head * row_elems, \
                scores.data(), inv_sum.data(), acc.data(), block_rows.data(), out_rows, num_heads * head_dim, head_dim); break;
              AMITY_NV(1) AMITY_NV(2) AMITY_NV(3) AMITY_NV(4) AMITY_NV(5) AMITY_NV(6) AMITY_NV(7) AMITY_NV(8)
              AMITY_NV(9) AMITY_NV(10) AMITY_NV(11) AMITY_NV(12) AMITY_NV(13) AMITY_NV(14) AMITY_NV(15) AMITY_NV(16)
  #undef AMITY_NV
            }
          }
          continue;
        }
  #endif
        // Other head sizes and CPUs: row by row, in the same order of keys.
        for (int64_t r = 0; r < piece.count; ++r) {
          const int64_t num_keys = first_keys + r;
          const float* query = queries.data() + r * group * head_dim;
          scores.resize(group * num_keys);
          walk_context(k_ptr, table, num_keys, block_size, slot_stride, kv_head * row_elems, row_elems,
                       [&](int64_t j, const cache_t* key) {
            const float* kr = widen(key, row.data(), head_dim);
            for (int64_t g = 0; g < group; ++g)
              scores[g * num_keys + j] = dot(query + g * head_dim, kr, head_dim);
          });
          for (int64_t g = 0; g < group; ++g) {
            float* sc = scores.data() + g * num_keys;
            float top = sc[0];
            for (int64_t j = 1; j < num_keys; ++j) top = sc[j] > top ? sc[j] : top;
            float sum = 0.f;
  #pragma omp simd reduction(+ : sum)
            for (int64_t j = 0; j < num_keys; ++j) {
              sc[j] = exp_nonpositive(sc[j] - top);
              sum += sc[j];
            }
            inv_sum[g] = 1.f / sum;
          }
          std::fill(acc.begin(), acc.begin() + group * head_dim, 0.f);
          walk_context(v_ptr, table, num_keys, block_size, slot_stride, kv_head * row_elems, row_elems,
                       [&](int64_t j, const cache_t* value) {
            const float* vr = widen(value, row.data(), head_dim);
            for (int64_t g = 0; g < group; ++g) {
              const float p = scores[g * num_keys + j];
              float* a = acc.data() + g * head_dim;
  #pragma omp simd
              for (int64_t d = 0; d < head_dim; ++d) a[d] += p * vr[d];
            }
          });
          for (int64_t g = 0; g < group; ++g) {
            scalar_t* dst = out_ptr + ((start + piece.first + r) * num_heads + kv_head * group + g) * head_dim;
            for (int64_t d = 0; d < head_dim; ++d)
              dst[d] = static_cast<scalar_t>(acc[g * head_dim + d] * inv_sum[g]);
          }
        }
      }
    }
#ifdef AMITY_ATTENTION_TILES
    if (tiles) _tile_release();
#endif
  }
}

// n new K or V values of a float32 model as a narrower cache keeps them, in place of
// a `.to()` per call (a dispatch and an iterator for a few thousand values, twice a
// layer and step): bfloat16 rounded as torch's vectorized conversion rounds (to
// nearest even; a NaN becomes 0xFFFF), float16 by c10's conversion: `.to()`'s bits.
inline uint16_t bf16_bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return std::isnan(x) ? 0xFFFF : static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

template <typename cache_t>
inline void narrow_row(const float* src, cache_t* dst, int64_t n) {
  if constexpr (std::is_same_v<cache_t, c10::BFloat16>) {
    uint16_t* out = reinterpret_cast<uint16_t*>(dst);
    int64_t d = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__)
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7FFF), nan = _mm512_set1_epi32(0xFFFF);
    for (; d + 16 <= n; d += 16) {
      const __m512 v = _mm512_loadu_ps(src + d);
      const __m512i bits = _mm512_castps_si512(v);
      const __m512i bias = _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(bits, 16), one));
      __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
      rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), nan);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + d), _mm512_cvtepi32_epi16(rounded));
    }
#endif
    for (; d < n; ++d) out[d] = bf16_bits(src[d]);
  } else {
    for (int64_t d = 0; d < n; ++d) dst[d] = static_cast<cache_t>(src[d]);
  }
}

// One head's n float32 values as an int8 cache keeps them: each group of kGroup
// rounded (to nearest even) in units of scale = its largest magnitude / 127, the
// scales after the values. torch's round(x / scale) gives the same values
// (attention.py's reference).
inline void quantize_row(const float* src, int8_t* dst, int64_t n) {
  for (int64_t g = 0; g < num_groups(n); ++g) {
    const int64_t begin = g * kGroup, end = std::min(n, begin + kGroup);
    float most = 0.f;
    for (int64_t d = begin; d < end; ++d) most = std::max(most, std::fabs(src[d]));
    const float scale = most / 127.f;
    for (int64_t d = begin; d < end; ++d) {
      const float units = scale > 0.f ? std::nearbyint(src[d] / scale) : 0.f;
      dst[d] = static_cast<int8_t>(units >= -127.f && units <= 127.f ? units : 0.f);  // a NaN group: zeros
    }
    std::memcpy(dst + n + g * static_cast<int64_t>(sizeof(scale)), &scale, sizeof(scale));
  }
}

// The step's new K/V rows into their slots, as the cache keeps them: a row copy per
// token (all index_copy_ does, without its dispatch and iterator set-up per call), or
// a float32 row rounded into a 16-bit cache on the way.
void write_kv(at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& k_in, const at::Tensor& v_in,
              const at::Tensor& slot_mapping_in) {
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "the K and V caches disagree on dtype");
  const at::ScalarType cache_type = k_cache.scalar_type();
  const bool quantized = cache_type == at::kChar;
  TORCH_CHECK(!quantized || (k_in.scalar_type() == at::kFloat && v_in.scalar_type() == at::kFloat),
              "an int8 KV cache takes float32 K/V");
  const bool narrowed = k_in.scalar_type() == at::kFloat && v_in.scalar_type() == at::kFloat &&
                        (cache_type == at::kBFloat16 || cache_type == at::kHalf || quantized);
  const at::Tensor k = narrowed ? k_in.contiguous() : contiguous_as(k_in, cache_type);
  const at::Tensor v = narrowed ? v_in.contiguous() : contiguous_as(v_in, cache_type);
  const at::Tensor slots = contiguous_as(slot_mapping_in, at::kLong);
  const int64_t num_kv_heads = k_cache.size(2), head_dim = k.size(2);
  const int64_t row_values = num_kv_heads * head_dim;
  const int64_t row_bytes = num_kv_heads * k_cache.size(3) * k_cache.element_size();
  const int64_t src_row_bytes = row_values * k.element_size();
  const int64_t quantized_row = row_elements<int8_t>(head_dim);
  TORCH_CHECK(row_bytes == (quantized ? num_kv_heads * quantized_row : row_values * k_cache.element_size()),
              "the new K/V's rows do not fit the cache's");
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* slot = slots.data_ptr<int64_t>();
  const char* k_src = static_cast<const char*>(k.data_ptr());
  const char* v_src = static_cast<const char*>(v.data_ptr());
  char* k_dst = static_cast<char*>(k_cache.data_ptr());
  char* v_dst = static_cast<char*>(v_cache.data_ptr());
  const auto put = [&](const char* src, char* dst) {
    const float* values = reinterpret_cast<const float*>(src);
    if (!narrowed) std::memcpy(dst, src, row_bytes);
    else if (quantized)
      for (int64_t h = 0; h < num_kv_heads; ++h)
        quantize_row(values + h * head_dim, reinterpret_cast<int8_t*>(dst) + h * quantized_row, head_dim);
    else if (cache_type == at::kBFloat16) narrow_row(values, reinterpret_cast<c10::BFloat16*>(dst), row_values);
    else narrow_row(values, reinterpret_cast<c10::Half*>(dst), row_values);
  };
  for (int64_t t = 0; t < slots.size(0); ++t) {
    TORCH_CHECK(slot[t] >= 0 && slot[t] < num_slots, "slot ", slot[t], " is outside the KV cache");
    put(k_src + t * src_row_bytes, k_dst + slot[t] * row_bytes);
    put(v_src + t * src_row_bytes, v_dst + slot[t] * row_bytes);
  }
}

}  // namespace

// q [T, H, D]; k, v [T, Hkv, D] (the step's new tokens, written to slot_mapping
// first, in the cache's dtype); k_cache, v_cache [num_blocks, block_size, Hkv, row]
// (q's dtype, or a narrower one for float32 queries; row is D, or for int8 D values
// and a float32 scale for each kGroup of them: row_elements); query_start [S + 1],
// context_lens [S], block_tables [S, max_blocks] (int64). Returns [T, H, D].
at::Tensor paged_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                           at::Tensor& k_cache, at::Tensor& v_cache,
                           const at::Tensor& slot_mapping, const at::Tensor& query_start_in,
                           const at::Tensor& context_lens_in, const at::Tensor& block_tables_in,
                           double scale, const std::optional<at::Tensor>& tile_rows) {
  TORCH_CHECK(q_in.device().is_cpu(), "amity::paged_attention is a CPU kernel");
  const bool* tiled = nullptr;
  if (tile_rows.has_value()) {
    TORCH_CHECK(tile_rows->scalar_type() == at::kBool && tile_rows->dim() == 1 &&
                    tile_rows->size(0) >= q_in.size(0) && tile_rows->is_contiguous(),
                "amity::paged_attention: tile_rows must be contiguous bool [>= T]");
    tiled = tile_rows->data_ptr<bool>();
  }
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "KV cache must be contiguous");
  // The new K/V as the cache keeps them (rounded once, if it is narrower), and used
  // so by every path below: a key's numbers do not depend on which chunk wrote it.
  write_kv(k_cache, v_cache, k_in, v_in, slot_mapping);

  at::Tensor q = q_in.contiguous();
  at::Tensor query_start = contiguous_as(query_start_in, at::kLong);
  at::Tensor context_lens = contiguous_as(context_lens_in, at::kLong);
  at::Tensor block_tables = contiguous_as(block_tables_in, at::kLong);
  at::Tensor out = at::empty_like(q);
  const int64_t* starts = query_start.data_ptr<int64_t>();
  const int64_t* ctx = context_lens.data_ptr<int64_t>();

  std::vector<Rows> pieces;
  const int64_t num_seqs = context_lens.size(0);
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = starts[s + 1] - starts[s];
    TORCH_CHECK(q_len >= 0 && q_len <= ctx[s], "sequence ", s, ": ", q_len, " new tokens in a context of ", ctx[s]);
    for (int64_t first = 0; first < q_len; first += kRowsPerItem)
      pieces.push_back({s, first, std::min(kRowsPerItem, q_len - first)});
  }
  if (!pieces.empty()) {
    const at::ScalarType q_type = q.scalar_type(), cache_type = k_cache.scalar_type();
    if (q_type == at::kFloat && cache_type == at::kFloat)
      attend_in_place<float, float>(q, k_cache, v_cache, starts, ctx, block_tables, pieces, scale, tiled, out);
    else if (q_type == at::kFloat && cache_type == at::kBFloat16)
      attend_in_place<float, c10::BFloat16>(q, k_cache, v_cache, starts, ctx, block_tables, pieces, scale, tiled, out);
    else if (q_type == at::kFloat && cache_type == at::kHalf)
      attend_in_place<float, c10::Half>(q, k_cache, v_cache, starts, ctx, block_tables, pieces, scale, tiled, out);
    else if (q_type == at::kFloat && cache_type == at::kChar)
      attend_in_place<float, int8_t>(q, k_cache, v_cache, starts, ctx, block_tables, pieces, scale, tiled, out);
    else if (q_type == at::kBFloat16 && cache_type == at::kBFloat16)
      attend_in_place<c10::BFloat16, c10::BFloat16>(q, k_cache, v_cache, starts, ctx, block_tables, pieces, scale,
                                                    tiled, out);
    else if (q_type == at::kHalf && cache_type == at::kHalf)
      attend_in_place<c10::Half, c10::Half>(q, k_cache, v_cache, starts, ctx, block_tables, pieces, scale, tiled, out);
    else
      TORCH_CHECK(false, "amity::paged_attention: queries in ", q_type, " with a ", cache_type,
                  " KV cache (it takes float32 queries with a float32, bfloat16, float16 or int8 cache, "
                  "or queries and cache of one 16-bit type)");
  }
  return out;
}

TORCH_LIBRARY_FRAGMENT(amity, m) {
  m.def("paged_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor slot_mapping, Tensor query_start, Tensor context_lens, Tensor block_tables, "
        "float scale, Tensor? tile_rows=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(amity, CPU, m) {
  m.impl("paged_attention", &paged_attention);
}
