// y = x W^T (+ bias) on the CPU for weights in GGUF's block formats, computed the
// way llama.cpp's CPU backend does: each token's activations are quantized to
// int8 per block of 32 inputs (a scale dx, as in Q8_0 / Q8_1), a block's dot
// products are exact int32 sums (AVX-512 VNNI: 64 multiply-adds an instruction,
// or AMX's int8 tiles, 16 tokens x 32 inputs x 16 outputs, for Q4_0, Q4_1 and
// Q8_0 from 16 tokens up), and each block adds to a float32 accumulator
//     Q4_0: d dx sum_k((q_k - 8) qx_k)             (w = d (q - 8), q 4-bit)
//     Q4_1: d dx sum_k(q_k qx_k) + m (dx sum_k qx_k) (w = d q + m, q 4-bit)
//     Q8_0: d dx sum_k(q_k qx_k)                    (w = d q, q int8)
// with d and m the file's float16 scales. GGUF's K-quants group 256 inputs in a
// super-block with a float16 d (and dmin) and small integer scales per
// sub-block; their sub-blocks take the same int8 activation blocks of 32:
//     Q4_K: (d sc) dx sum_k(q_k qx_k) - (dmin m) (dx sum_k qx_k)   per 32 inputs
//           (w = d sc q - dmin m, q 4-bit, sc and m 6-bit)
//     Q6_K: (d sc) dx sum_k((q_k - 32) qx_k)                      per 16 inputs
//           (w = d sc (q - 32), q 6-bit, sc int8)
// with d sc and dmin m exact in float32 (at most 19 significant bits), so the
// weights are exactly those gguf-py's dequantize gives. The weights stream at 4.5-8.5 bits
// each and one instruction does the work of four float32 fmas, so a single
// stream is bound by memory and a prefill by int8 throughput.
//
// Numbers: a token's int8 activations and block scales depend on that token
// alone, the integer sums are exact, and the float steps run in one order for
// every token, so a token's outputs are the same bits whatever its batch, tile
// or thread.
//
// Layout ([N / 32, K / 32, BLOCK_BYTES] uint8): panels of 32 outputs, each its
// K / 32 blocks in order (one stream of bytes). A block is 8 quads (4 inputs x 32
// outputs), then d[32] (and for Q4_1 m[32]) as float16. 4-bit quads are 64
// bytes: byte 4i + j holds q of output i (low nibble) and of output i + 16 (high
// nibble) at input 4g + j, so the low nibbles are VNNI's 16 lanes x 4 inputs for
// outputs 0-15 and the high ones for 16-31. 8-bit quads are 128 bytes, outputs
// 0-15 then 16-31, each q stored as q + 128 (VNNI multiplies unsigned by signed
// bytes; the 128 comes off the integer sum exactly, as Q4_0's 8 does).
// K-quants: [N / 32, K / 256, SUPER_BYTES], a super-block per panel: d[32] (and
// Q4_K's dmin[32]) float16, then per sub-block sc[32] (Q4_K: then m[32] after all
// sc), one byte each, then the 8 blocks' quads as above: Q4_K's 4-bit; Q6_K's q
// (0-63, zero point 32) as 96 bytes: their low 4 bits as a 4-bit quad, then 32
// bytes of their top 2 bits, byte c holding those of VNNI lane bytes c and c + 32
// of outputs 0-15 (bits 0-1, 2-3), then of outputs 16-31 (bits 4-5, 6-7), so one
// broadcast and two shifts put every top at bits 4-5 of its lane byte.

#include <torch/extension.h>

#include "panel_queue.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define AMITY_BLOCK_VNNI 1
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#define AMITY_BLOCK_TILES 1
#endif
#if defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define AMITY_BLOCK_INT8_TILES 1
#endif
#endif

namespace amity {
at::Tensor contiguous_as(const at::Tensor& t, at::ScalarType dtype);  // packed_linear.cpp
bool amx_tiles();                                                     // amx.cpp
void amx_configure(int count, const uint8_t* rows, const uint16_t* colsb);  // amx.cpp
using PanelRows = const uint16_t* (*)(const void* weight, int64_t K2, int64_t panel, int64_t k0, int64_t count,
                                      uint16_t* buffer);
void tile_linear(const at::Tensor& x32, int64_t N, const void* weight, PanelRows panel_rows, bool parallel,
                 float* out);                                         // bf16_linear.cpp
}
using amity::contiguous_as;

namespace {

constexpr int64_t NR = 32;  // outputs per panel
constexpr int64_t KB = 32;  // inputs per block
constexpr int MR = 8;       // tokens per tile: 16 int32 sums in registers
constexpr int64_t TM = 16;  // tokens per AMX tile (int8 tiles, below)

enum Format : int64_t { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2, Q4_K = 3, Q6_K = 4 };

template <int F>
struct Layout {
  static constexpr int bits = F == Q8_0 ? 8 : F == Q6_K ? 6 : 4;         // per stored q
  static constexpr bool nibbles = bits != 8;                              // the low 4 bits as 4-bit quads
  static constexpr int64_t quad_bytes = bits == 4 ? 64 : bits == 6 ? 96 : 128;
  static constexpr int64_t scales = KB / 4 * quad_bytes;                   // offset of d[NR]
  static constexpr int64_t block_bytes = scales + (F == Q4_1 ? 2 : 1) * NR * 2;
  static constexpr int32_t zero = F == Q4_0 ? 8 : F == Q8_0 ? 128 : F == Q6_K ? 32 : 0;  // stored q - zero = q
  static constexpr int64_t ahead = 4096 / block_bytes + 1;                 // blocks prefetched, ~4 KiB
  // K-quants: a super-block of 256 inputs, scales per sub-block of `sub` inputs.
  static constexpr bool super = F == Q4_K || F == Q6_K;
  static constexpr int64_t sub = F == Q6_K ? 16 : 32;
  static constexpr int64_t subs = 256 / sub;
  static constexpr int64_t sc_at = F == Q4_K ? 4 * NR : 2 * NR;            // after d (and dmin)
  static constexpr int64_t m_at = sc_at + subs * NR;                       // Q4_K's mins
  static constexpr int64_t quads_at = sc_at + (F == Q4_K ? 2 : 1) * subs * NR;
  static constexpr int64_t super_bytes = quads_at + 256 / 4 * quad_bytes;
  // What a panel is made of: blocks of 32 inputs, or super-blocks of 256.
  static constexpr int64_t unit_inputs = super ? 256 : KB;
  static constexpr int64_t unit_bytes = super ? super_bytes : block_bytes;
};

int64_t unit_bytes(int64_t format) {
  switch (format) {
    case Q4_0: return Layout<Q4_0>::unit_bytes;
    case Q4_1: return Layout<Q4_1>::unit_bytes;
    case Q8_0: return Layout<Q8_0>::unit_bytes;
    case Q4_K: return Layout<Q4_K>::unit_bytes;
    default: return Layout<Q6_K>::unit_bytes;
  }
}

int64_t unit_inputs(int64_t format) { return format == Q4_K || format == Q6_K ? 256 : KB; }

// A token's activations per block of 32: q = round(x * (1 / dx)) (ties to even)
// with dx = max|x| / 127, n = sum(q), and s = dx * n for Q4_1's offsets; h holds
// the sums of each half (Q6_K's sub-blocks of 16).
struct Activations {
  const int8_t* q;   // [T, K]
  const float* d;    // [T, K / 32]
  const float* s;    // [T, K / 32]
  const int32_t* n;  // [T, K / 32]
  const int32_t* h;  // [T, K / 16]
};

void quantize_block(const float* x, int8_t* q, float& d, float& s, int32_t& n, int32_t* h) {
#ifdef AMITY_BLOCK_VNNI
  const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
  d = amax / 127.f;
  const __m512 inverse = _mm512_set1_ps(d != 0.f ? 1.f / d : 0.f);
  // cvtps rounds as MXCSR says: to nearest, ties to even.
  const __m512i q_lo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inverse));
  const __m512i q_hi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inverse));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(q_lo));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(q_hi));
  h[0] = _mm512_reduce_add_epi32(q_lo);
  h[1] = _mm512_reduce_add_epi32(q_hi);
  n = h[0] + h[1];
#else
  float amax = 0.f;
  for (int64_t k = 0; k < KB; ++k) amax = std::max(amax, std::fabs(x[k]));
  d = amax / 127.f;
  const float inverse = d != 0.f ? 1.f / d : 0.f;
  h[0] = h[1] = 0;
  for (int64_t k = 0; k < KB; ++k) {
    const int v = std::clamp(static_cast<int>(std::nearbyint(x[k] * inverse)), -127, 127);
    q[k] = static_cast<int8_t>(v);
    h[k / 16] += v;
  }
  n = h[0] + h[1];
#endif
  s = d * static_cast<float>(n);
}

#ifdef AMITY_BLOCK_VNNI
// A block's one float step, the same on every path (VNNI's registers or AMX's
// tiles): a token's acc[0 .. NR) += d dx (sum - zero n) (+ m s), outputs 0-15
// from sum[0] and 16-31 from sum[1], the block's exact integer sums.
template <int F>
struct BlockScales {
  using L = Layout<F>;
  __m512 d[2], m[2];  // m: Q4_1's
  explicit BlockScales(const uint8_t* block) {
    const __m256i* scales = reinterpret_cast<const __m256i*>(block + L::scales);
    for (int h = 0; h < 2; ++h) {
      d[h] = _mm512_cvtph_ps(_mm256_loadu_si256(scales + h));
      m[h] = F == Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256(scales + 2 + h)) : _mm512_setzero_ps();
    }
  }
  // `row`: the token's row of a's per-block values (token * K / 32 + block).
  void add(const __m512i (&sum)[2], const Activations& a, int64_t row, float* acc) const {
    const __m512 dx = _mm512_set1_ps(a.d[row]);
    const __m512i correction = _mm512_set1_epi32(L::zero * a.n[row]);
    for (int h = 0; h < 2; ++h) {
      float* c = acc + h * 16;
      const __m512i exact = L::zero ? _mm512_sub_epi32(sum[h], correction) : sum[h];
      __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(d[h], dx), _mm512_loadu_ps(c));
      if constexpr (F == Q4_1)
        v = _mm512_fmadd_ps(m[h], _mm512_set1_ps(a.s[row]), v);
      _mm512_storeu_ps(c, v);
    }
  }
};
#endif

// acc[m][0 .. NR) += the panel's outputs for M tokens from m0, every block.
template <int F, int M>
void tile(const uint8_t* panel, int64_t K, const Activations& a, int64_t m0, float* acc) {
  using L = Layout<F>;
  const int64_t num_blocks = K / KB;
#ifdef AMITY_BLOCK_VNNI
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* block = panel + b * L::block_bytes;
    // Prefetched well ahead where a panel's blocks take long to compute (three
    // tokens or more): one core's demand misses alone read memory at a fraction of
    // its bandwidth on this kind of machine. For one or two tokens the hardware
    // prefetchers keep up, and the extra requests cost 4-9% (benchmarks/README.md,
    // session 26).
    if constexpr (M > 2)
      for (int64_t line = 0; line < L::block_bytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(block + L::ahead * L::block_bytes + line), _MM_HINT_T0);
    __m512i sum[M][2];
    for (int m = 0; m < M; ++m) sum[m][0] = sum[m][1] = _mm512_setzero_si512();
    // Straight-line: rolled, gcc moves the sums between registers every quad
    // (1.4-1.7x slower at 128 tokens).
#pragma GCC unroll 8
    for (int64_t g = 0; g < KB / 4; ++g) {
      __m512i lo, hi;
      if constexpr (L::nibbles) {
        const __m512i v = _mm512_loadu_si512(block + g * L::quad_bytes);
        lo = _mm512_and_si512(v, low4);
        hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      } else {
        lo = _mm512_loadu_si512(block + g * L::quad_bytes);
        hi = _mm512_loadu_si512(block + g * L::quad_bytes + 64);
      }
      for (int m = 0; m < M; ++m) {
        int32_t four;
        std::memcpy(&four, a.q + (m0 + m) * K + b * KB + g * 4, 4);
        const __m512i xq = _mm512_set1_epi32(four);
        sum[m][0] = _mm512_dpbusd_epi32(sum[m][0], lo, xq);
        sum[m][1] = _mm512_dpbusd_epi32(sum[m][1], hi, xq);
      }
    }
    const BlockScales<F> scales(block);
    for (int m = 0; m < M; ++m) scales.add(sum[m], a, (m0 + m) * num_blocks + b, acc + m * NR);
  }
#else
  // Other CPUs: the same integer sums and float steps, one output at a time.
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* block = panel + b * L::block_bytes;
    const c10::Half* scales = reinterpret_cast<const c10::Half*>(block + L::scales);
    for (int m = 0; m < M; ++m) {
      const int8_t* xq = a.q + (m0 + m) * K + b * KB;
      const int64_t row = (m0 + m) * num_blocks + b;
      for (int64_t n = 0; n < NR; ++n) {
        int32_t sum = 0;
        for (int64_t k = 0; k < KB; ++k) {
          int32_t stored;
          if constexpr (L::nibbles) {
            const uint8_t byte = block[k / 4 * L::quad_bytes + (n % 16) * 4 + k % 4];
            stored = n < 16 ? byte & 15 : byte >> 4;
          } else {
            stored = block[k / 4 * L::quad_bytes + (n / 16) * 64 + (n % 16) * 4 + k % 4];
          }
          sum += stored * xq[k];
        }
        sum -= L::zero * a.n[row];
        float& c = acc[m * NR + n];
        c = std::fma(static_cast<float>(sum), static_cast<float>(scales[n]) * a.d[row], c);
        if constexpr (F == Q4_1) c = std::fma(static_cast<float>(scales[NR + n]), a.s[row], c);
      }
    }
  }
#endif
}

// K-quants: acc[m][0 .. NR) += the panel's outputs for M tokens from m0, every
// super-block; one float step per sub-block (and its min), in input order.
template <int F, int M>
void tile_super(const uint8_t* panel, int64_t K, const Activations& a, int64_t m0, float* acc) {
  using L = Layout<F>;
  const int64_t num_blocks = K / KB;
  constexpr int64_t quads_per_sub = L::sub / 4;
#ifdef AMITY_BLOCK_VNNI
  const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
  // Q6_K's tops: lane bytes 0-31 from bits 0-1 (4-5), 32-63 from bits 2-3 (6-7).
  const __m512i lo_shift = _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4), hi_shift = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0);
  // Prefetched ~4 KiB ahead, a sub-block's share of the super-block at a time.
  constexpr int64_t chunk = L::super_bytes / L::subs, ahead = 4096 / chunk + 1;
  for (int64_t sb = 0; sb < K / 256; ++sb) {
    const uint8_t* super = panel + sb * L::super_bytes;
    const __m512 d[2] = {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(super))),
                         _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(super + 32)))};
    __m512 dmin[2];
    if constexpr (F == Q4_K)
      for (int h = 0; h < 2; ++h)
        dmin[h] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(super + 64 + 32 * h)));
    for (int64_t s = 0; s < L::subs; ++s) {
      for (int64_t line = 0; line < chunk; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(super + (s + ahead) * chunk + line), _MM_HINT_T0);
      const uint8_t* quads = super + L::quads_at + s * quads_per_sub * L::quad_bytes;
      const int64_t input = sb * 256 + s * L::sub;
      __m512i sum[M][2];
      for (int m = 0; m < M; ++m) sum[m][0] = sum[m][1] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int64_t g = 0; g < quads_per_sub; ++g) {
        __m512i lo, hi;
        if constexpr (L::nibbles) {
          const __m512i v = _mm512_loadu_si512(quads + g * L::quad_bytes);
          lo = _mm512_and_si512(v, low4);
          hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
          if constexpr (L::bits == 6) {
            const __m512i tops = _mm512_broadcast_i64x4(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quads + g * L::quad_bytes + 64)));
            lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_sllv_epi64(tops, lo_shift), top2));
            hi = _mm512_or_si512(hi, _mm512_and_si512(_mm512_srlv_epi64(tops, hi_shift), top2));
          }
        } else {
          lo = _mm512_loadu_si512(quads + g * L::quad_bytes);
          hi = _mm512_loadu_si512(quads + g * L::quad_bytes + 64);
        }
        for (int m = 0; m < M; ++m) {
          int32_t four;
          std::memcpy(&four, a.q + (m0 + m) * K + input + g * 4, 4);
          const __m512i xq = _mm512_set1_epi32(four);
          sum[m][0] = _mm512_dpbusd_epi32(sum[m][0], lo, xq);
          sum[m][1] = _mm512_dpbusd_epi32(sum[m][1], hi, xq);
        }
      }
      // d sc and dmin m: exact products of a float16 and a small integer.
      __m512 scale[2], offset[2];
      for (int h = 0; h < 2; ++h) {
        const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(super + L::sc_at + s * NR + 16 * h));
        const __m512i sc32 = F == Q6_K ? _mm512_cvtepi8_epi32(sc) : _mm512_cvtepu8_epi32(sc);
        scale[h] = _mm512_mul_ps(d[h], _mm512_cvtepi32_ps(sc32));
        if constexpr (F == Q4_K) {
          const __m128i mn = _mm_loadu_si128(reinterpret_cast<const __m128i*>(super + L::m_at + s * NR + 16 * h));
          offset[h] = _mm512_mul_ps(dmin[h], _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(mn)));
        }
      }
      for (int m = 0; m < M; ++m) {
        const int64_t row = (m0 + m) * num_blocks + input / KB;
        const __m512 dx = _mm512_set1_ps(a.d[row]);
        const __m512i correction = _mm512_set1_epi32(L::zero * a.h[(m0 + m) * (K / 16) + input / 16]);
        for (int h = 0; h < 2; ++h) {
          float* c = acc + m * NR + h * 16;
          const __m512i exact = L::zero ? _mm512_sub_epi32(sum[m][h], correction) : sum[m][h];
          __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(scale[h], dx), _mm512_loadu_ps(c));
          if constexpr (F == Q4_K) v = _mm512_fnmadd_ps(offset[h], _mm512_set1_ps(a.s[row]), v);
          _mm512_storeu_ps(c, v);
        }
      }
    }
  }
#else
  // Other CPUs: the same integer sums and float steps, one output at a time.
  for (int64_t sb = 0; sb < K / 256; ++sb) {
    const uint8_t* super = panel + sb * L::super_bytes;
    const c10::Half* d = reinterpret_cast<const c10::Half*>(super);
    for (int64_t s = 0; s < L::subs; ++s) {
      const uint8_t* quads = super + L::quads_at + s * quads_per_sub * L::quad_bytes;
      const int64_t input = sb * 256 + s * L::sub;
      for (int m = 0; m < M; ++m) {
        const int8_t* xq = a.q + (m0 + m) * K + input;
        const int64_t row = (m0 + m) * num_blocks + input / KB;
        for (int64_t n = 0; n < NR; ++n) {
          int32_t sum = 0;
          for (int64_t k = 0; k < L::sub; ++k) {
            int32_t stored;
            if constexpr (L::nibbles) {
              const int64_t lane = (n % 16) * 4 + k % 4;
              const uint8_t byte = quads[k / 4 * L::quad_bytes + lane];
              stored = n < 16 ? byte & 15 : byte >> 4;
              if constexpr (L::bits == 6) {
                const uint8_t tops = quads[k / 4 * L::quad_bytes + 64 + lane % 32];
                stored |= ((tops >> ((n < 16 ? 0 : 4) + (lane < 32 ? 0 : 2))) & 3) << 4;
              }
            } else {
              stored = quads[k / 4 * L::quad_bytes + (n / 16) * 64 + (n % 16) * 4 + k % 4];
            }
            sum += stored * xq[k];
          }
          sum -= L::zero * a.h[(m0 + m) * (K / 16) + input / 16];
          const float sc = F == Q6_K ? static_cast<float>(static_cast<int8_t>(super[L::sc_at + s * NR + n]))
                                     : static_cast<float>(super[L::sc_at + s * NR + n]);
          float& c = acc[m * NR + n];
          c = std::fma(static_cast<float>(sum), (static_cast<float>(d[n]) * sc) * a.d[row], c);
          if constexpr (F == Q4_K)
            c = std::fma(-(static_cast<float>(d[NR + n]) * static_cast<float>(super[L::m_at + s * NR + n])),
                         a.s[row], c);
        }
      }
    }
  }
#endif
}

#ifdef AMITY_BLOCK_INT8_TILES
// The same integer sums on AMX's int8 tiles: TDPBSUD multiplies a tile of 16
// tokens x 32 int8 activations (one block of inputs) by a tile of the block's 8
// quads x 16 outputs x 4 stored weights, which is a quad half's layout as it is
// (8-bit: rows 128 bytes apart; 4-bit: each nibble half unpacked to its own
// bytes first). The sums go through memory into BlockScales' float step, so a
// token's outputs are the bits the VNNI tile gives them: the path is a matter of
// speed, picked by the batch's size. Tiles: 0-3 sums (token tile x outputs
// 0-15 / 16-31), 4-5 activations, 6-7 weights.
constexpr int64_t UNPACKED = 2 * (KB / 4) * 64;   // a 4-bit block unpacked: two halves of 8 quads

void configure_int8_tiles() {
  const uint8_t rows[8] = {TM, TM, TM, TM, TM, TM, KB / 4, KB / 4};
  const uint16_t colsb[8] = {64, 64, 64, 64, KB, KB, 64, 64};
  amity::amx_configure(8, rows, colsb);
}

template <int F>
void unpack_block(const uint8_t* block, uint8_t* out) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < KB / 4; ++g) {
    const __m512i v = _mm512_loadu_si512(block + g * Layout<F>::quad_bytes);
    _mm512_storeu_si512(out + g * 64, _mm512_and_si512(v, low4));
    _mm512_storeu_si512(out + UNPACKED / 2 + g * 64, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
  }
}

// acc[m][0 .. NR) += the panel's outputs for TT * 16 tokens from m0, every block.
// `unpacked`: a 4-bit panel's blocks already unpacked, or null to unpack each
// into `scratch` (UNPACKED bytes) as it comes. The tiles compute block b + 1
// while the vector units add block b, whose sums were stored a block earlier.
template <int F, int TT>
void int8_tiles(const uint8_t* panel, const uint8_t* unpacked, uint8_t* scratch, int64_t K, const Activations& a,
                int64_t m0, float* acc) {
  using L = Layout<F>;
  const int64_t num_blocks = K / KB;
  constexpr int64_t stride = L::nibbles ? 64 : L::quad_bytes, second_half = L::nibbles ? UNPACKED / 2 : 64;
  alignas(64) int32_t sums[2][TT][2][TM * 16];
  const auto products = [&](int64_t b) {
    const uint8_t* block = panel + b * L::block_bytes;
    if (!unpacked)
      for (int64_t line = 0; line < L::block_bytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(block + L::ahead * L::block_bytes + line), _MM_HINT_T0);
    const uint8_t* weights = block;
    if constexpr (L::nibbles) {
      if (unpacked) {
        weights = unpacked + b * UNPACKED;
      } else {
        unpack_block<F>(block, scratch);
        __asm__ volatile("" ::: "memory");  // the unpacked bytes written before the tile loads them (bf16_linear.cpp)
        weights = scratch;
      }
    }
    auto& out = sums[b & 1];
    _tile_loadd(6, weights, stride);
    _tile_loadd(7, weights + second_half, stride);
    _tile_loadd(4, a.q + m0 * K + b * KB, K);
    _tile_zero(0);
    _tile_zero(1);
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 4, 7);
    if constexpr (TT == 2) {
      _tile_loadd(5, a.q + (m0 + TM) * K + b * KB, K);
      _tile_zero(2);
      _tile_zero(3);
      _tile_dpbsud(2, 5, 6);
      _tile_dpbsud(3, 5, 7);
    }
    _tile_stored(0, out[0][0], 64);
    _tile_stored(1, out[0][1], 64);
    if constexpr (TT == 2) {
      _tile_stored(2, out[1][0], 64);
      _tile_stored(3, out[1][1], 64);
    }
  };
  products(0);
  for (int64_t b = 0; b < num_blocks; ++b) {
    if (b + 1 < num_blocks) products(b + 1);
    const auto& in = sums[b & 1];
    const BlockScales<F> scales(panel + b * L::block_bytes);
    for (int64_t t = 0; t < TT; ++t)
      for (int64_t m = 0; m < TM; ++m) {
        const __m512i sum[2] = {_mm512_load_si512(in[t][0] + m * 16), _mm512_load_si512(in[t][1] + m * 16)};
        scales.add(sum, a, (m0 + t * TM + m) * num_blocks + b, acc + (t * TM + m) * NR);
      }
  }
}
#endif

struct Problem {
  Activations a;
  const uint8_t* weight;
  float* out;         // [T, N]
  int64_t T, K, N;
};

// Rows in groups of 32 (then 16) on AMX's int8 tiles when `on_int8_tiles`, the
// rest (and every row of the K-quants) 8 at a time on VNNI: the same bits either way.
template <int F>
void run_panel(const Problem& pb, int64_t panel, bool on_int8_tiles) {
  const uint8_t* w = pb.weight + panel * (pb.K / Layout<F>::unit_inputs) * Layout<F>::unit_bytes;
  alignas(64) float acc[2 * TM * NR];
  int64_t m0 = 0;
#ifdef AMITY_BLOCK_INT8_TILES
  if constexpr (F == Q4_0 || F == Q4_1 || F == Q8_0) {
    if (on_int8_tiles && pb.T >= TM) {
      // Several passes over a 4-bit panel: unpack it once (it stays in L2).
      thread_local std::vector<uint8_t> unpacked;  // OpenMP's threads persist: grown once
      const int64_t num_blocks = pb.K / KB;
      if (unpacked.size() < static_cast<size_t>((num_blocks + 1) * UNPACKED)) unpacked.resize((num_blocks + 1) * UNPACKED);
      uint8_t* scratch = unpacked.data() + num_blocks * UNPACKED;
      const uint8_t* whole = nullptr;
      if (Layout<F>::nibbles && pb.T > 2 * TM) {
        for (int64_t b = 0; b < num_blocks; ++b) unpack_block<F>(w + b * Layout<F>::block_bytes, unpacked.data() + b * UNPACKED);
        whole = unpacked.data();
      }
      for (; m0 + TM <= pb.T; ) {
        const int64_t count = m0 + 2 * TM <= pb.T ? 2 * TM : TM;
        std::fill(acc, acc + count * NR, 0.f);
        if (count == 2 * TM) int8_tiles<F, 2>(w, whole, scratch, pb.K, pb.a, m0, acc);
        else int8_tiles<F, 1>(w, whole, scratch, pb.K, pb.a, m0, acc);
        for (int64_t m = 0; m < count; ++m) std::memcpy(pb.out + (m0 + m) * pb.N + panel * NR, acc + m * NR, NR * 4);
        m0 += count;
      }
    }
  }
#endif
  for (; m0 < pb.T; m0 += MR) {
    const int64_t count = std::min<int64_t>(MR, pb.T - m0);
    std::fill(acc, acc + count * NR, 0.f);
    switch (count) {
#define AMITY_TILE(M)                                           \
  case M:                                                         \
    if constexpr (Layout<F>::super) tile_super<F, M>(w, pb.K, pb.a, m0, acc); \
    else tile<F, M>(w, pb.K, pb.a, m0, acc);                      \
    break;
      AMITY_TILE(1) AMITY_TILE(2) AMITY_TILE(3) AMITY_TILE(4) AMITY_TILE(5) AMITY_TILE(6)
      AMITY_TILE(7) AMITY_TILE(8)
#undef AMITY_TILE
      default: break;
    }
    for (int64_t m = 0; m < count; ++m) std::memcpy(pb.out + (m0 + m) * pb.N + panel * NR, acc + m * NR, NR * 4);
  }
}

template <int F>
void run(const Problem& pb, bool parallel, bool on_int8_tiles) {
  amity::PanelQueue panels(pb.N / NR, parallel);
#pragma omp parallel if (parallel)
  {
#ifdef AMITY_BLOCK_INT8_TILES
    if (on_int8_tiles) configure_int8_tiles();
#endif
    for (int64_t panel; (panel = panels.next()) >= 0;) run_panel<F>(pb, panel, on_int8_tiles);
#ifdef AMITY_BLOCK_INT8_TILES
    if (on_int8_tiles) _tile_release();
#endif
  }
}

#ifdef AMITY_BLOCK_TILES
// Pair rows [k0, k0 + count) of a panel as bf16_linear's tiles take them: per
// input pair, outputs 0-15 then 16-31, each (w[k], w[k + 1]) in bfloat16, with
// w = d (q - zero) (+ m) computed in float32 (d (q - zero) is exact: a float16
// times a small integer; Q4_1's m adds one rounding) and rounded to nearest even.
// A quad's dword lane i holds output i's 4 inputs: its low words are pair row 2g,
// its high words row 2g + 1.
template <int F>
const uint16_t* dequantize_panel(const void* weight, int64_t K2, int64_t panel, int64_t k0, int64_t count,
                                 uint16_t* rows) {
  using L = Layout<F>;
  const int64_t num_blocks = count * 2 / KB;
  const uint8_t* blocks = static_cast<const uint8_t*>(weight) + (panel * (K2 * 2 / KB) + k0 * 2 / KB) * L::block_bytes;
  const __m512i low4 = _mm512_set1_epi8(0x0F), zero = _mm512_set1_epi32(L::zero);
  // lane l of a vector takes output l / 2 of its eight
  const __m512i pairs_lo = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i pairs_hi = _mm512_add_epi32(pairs_lo, _mm512_set1_epi32(8));
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* block = blocks + b * L::block_bytes;
    for (int64_t line = 0; line < L::block_bytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(block + L::ahead * L::block_bytes + line), _MM_HINT_T0);
    const __m256i* scales = reinterpret_cast<const __m256i*>(block + L::scales);
    __m512 d[2][2], m[2][2];
    for (int h = 0; h < 2; ++h) {
      const __m512 dh = _mm512_cvtph_ps(_mm256_loadu_si256(scales + h));
      d[h][0] = _mm512_permutexvar_ps(pairs_lo, dh), d[h][1] = _mm512_permutexvar_ps(pairs_hi, dh);
      const __m512 mh = F == Q4_1 ? _mm512_cvtph_ps(_mm256_loadu_si256(scales + 2 + h)) : _mm512_setzero_ps();
      m[h][0] = _mm512_permutexvar_ps(pairs_lo, mh), m[h][1] = _mm512_permutexvar_ps(pairs_hi, mh);
    }
    uint16_t* out = rows + b * (KB / 2) * 2 * NR;
#pragma GCC unroll 8
    for (int64_t g = 0; g < KB / 4; ++g) {
      __m512i q[2];  // outputs 0-15 and 16-31
      if constexpr (L::nibbles) {
        const __m512i v = _mm512_loadu_si512(block + g * L::quad_bytes);
        q[0] = _mm512_and_si512(v, low4);
        q[1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      } else {
        q[0] = _mm512_loadu_si512(block + g * L::quad_bytes);
        q[1] = _mm512_loadu_si512(block + g * L::quad_bytes + 64);
      }
      for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 2; ++j) {
          const __m256i bytes = _mm512_cvtepi32_epi16(j ? _mm512_srli_epi32(q[h], 16) : q[h]);
          __m512 w[2];
          for (int e = 0; e < 2; ++e) {
            const __m512i ints = _mm512_sub_epi32(_mm512_cvtepu8_epi32(e ? _mm256_extracti128_si256(bytes, 1)
                                                                           : _mm256_castsi256_si128(bytes)), zero);
            w[e] = F == Q4_1 ? _mm512_fmadd_ps(_mm512_cvtepi32_ps(ints), d[h][e], m[h][e])
                             : _mm512_mul_ps(_mm512_cvtepi32_ps(ints), d[h][e]);
          }
          _mm512_storeu_si512(out + (2 * g + j) * 2 * NR + h * 16 * 2, (__m512i)_mm512_cvtne2ps_pbh(w[1], w[0]));
        }
    }
  }
  return rows;
}
#endif

}  // namespace

namespace {
// x's T rows (T > 0) on the int8 blocks above: float32 without bias into `out`'s
// rows, N floats apart; on both threads when `parallel`.
void vnni_linear(const at::Tensor& x32, const at::Tensor& weight, int64_t format, bool parallel, float* out) {
  const int64_t T = x32.size(0), K = x32.size(1), N = weight.size(0) * NR;
  // The activations' int8 blocks, scales and sums: the calling thread's scratch, grown
  // once (a decode step calls this about 120 times; three allocations each cost more
  // than quantizing one token).
  thread_local std::vector<int8_t> x_q;
  thread_local std::vector<float> x_scales;
  thread_local std::vector<int32_t> x_sums;
  if (x_q.size() < static_cast<size_t>(T * K)) x_q.resize(T * K);
  if (x_scales.size() < static_cast<size_t>(2 * T * (K / KB))) x_scales.resize(2 * T * (K / KB));
  if (x_sums.size() < static_cast<size_t>(T * (K / KB + K / 16))) x_sums.resize(T * (K / KB + K / 16));
  const float* xp = x32.data_ptr<float>();
  int8_t* qp = x_q.data();
  float* dp = x_scales.data();
  float* sp = dp + T * (K / KB);
  int32_t* np = x_sums.data();
  int32_t* hp = np + T * (K / KB);
  for (int64_t i = 0; i < T * (K / KB); ++i)
    quantize_block(xp + i * KB, qp + i * KB, dp[i], sp[i], np[i], hp + 2 * i);
  const Problem pb{{qp, dp, sp, np, hp}, weight.data_ptr<uint8_t>(), out, T, K, N};
#ifdef AMITY_BLOCK_INT8_TILES
  const bool on_int8_tiles = T >= TM && format <= Q8_0 && amity::amx_tiles();
#else
  const bool on_int8_tiles = false;
#endif
  switch (format) {
    case Q4_0: run<Q4_0>(pb, parallel, on_int8_tiles); break;
    case Q4_1: run<Q4_1>(pb, parallel, on_int8_tiles); break;
    case Q8_0: run<Q8_0>(pb, parallel, on_int8_tiles); break;
    case Q4_K: run<Q4_K>(pb, parallel, false); break;
    default: run<Q6_K>(pb, parallel, false); break;
  }
}

// x's T rows on AMX tiles, the weights dequantized to bfloat16 a panel at a time, into
// `out`'s rows as above.
void tiles_linear(const at::Tensor& x32, const at::Tensor& weight, int64_t format, bool parallel, float* out) {
#ifdef AMITY_BLOCK_TILES
  TORCH_CHECK(amity::amx_tiles(), "amity::block_linear: Linux refused this process AMX's tile state");
  const amity::PanelRows rows = format == Q4_0 ? dequantize_panel<Q4_0>
                                : format == Q4_1 ? dequantize_panel<Q4_1> : dequantize_panel<Q8_0>;
  amity::tile_linear(x32, weight.size(0) * NR, weight.data_ptr<uint8_t>(), rows, parallel, out);
#else
  TORCH_CHECK(false, "amity::block_linear: tiles need a CPU with AMX-BF16 (this build has none)");
#endif
}
}  // namespace

// x [T, K] float32 or bfloat16, K a multiple of 32 (256 for K-quants); weight
// [N / 32, K / 32, block bytes] (K-quants: [N / 32, K / 256, super-block bytes])
// uint8 as above; format 0 (Q4_0), 1 (Q4_1), 2 (Q8_0), 3 (Q4_K) or 4 (Q6_K);
// bias [N] or undefined; tile_rows: undefined, or bool [>= T] whose first T say
// which rows run on tiles (Q4_0, Q4_1, Q8_0 on a CPU with AMX) rather than on the
// int8 blocks: a row's numbers depend only on its own path (prompt_rows.py says
// who takes which). Returns [T, N] in x's dtype.
at::Tensor block_linear(const at::Tensor& x, const at::Tensor& weight, int64_t format,
                        const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& tile_rows) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "amity::block_linear takes a 2-D CPU input");
  TORCH_CHECK(format >= Q4_0 && format <= Q6_K, "amity::block_linear: unknown format");
  TORCH_CHECK(weight.scalar_type() == at::kByte && weight.dim() == 3 && weight.size(2) == unit_bytes(format) &&
                  weight.is_contiguous(),
              "amity::block_linear: weight must be contiguous uint8 [N / 32, K / block inputs, block bytes]");
  TORCH_CHECK(weight.size(1) * unit_inputs(format) == x.size(1), "weight and input disagree on in_features");
  const int64_t T = x.size(0);
  const at::Tensor x32 = contiguous_as(x, at::kFloat);
  const at::Tensor bias32 = bias.has_value() ? contiguous_as(*bias, at::kFloat) : at::Tensor();
  const int64_t N = weight.size(0) * NR;
  // Straight to the CPU allocator: the dispatcher's at::empty (and narrow below) cost
  // about a microsecond of a one-token call.
  at::Tensor out = at::detail::empty_cpu({T, N}, at::kFloat, false, std::nullopt);
  float* o = out.data_ptr<float>();
  const bool parallel = weight.numel() >= (128 << 10);  // waking a thread pays past ~64 KiB each
  const auto compute = [&](const at::Tensor& rows, bool tiled, float* into) {  // rows: never empty
    (tiled ? tiles_linear : vnni_linear)(rows, weight, format, parallel, into);
  };
  // Runs of rows on one path, (first row, tiled), in order. Counted here, not by
  // torch ops: a decode step calls this for every layer with no row on tiles, and
  // each op's dispatch would cost more than the count.
  std::vector<std::pair<int64_t, bool>> runs;
  const bool* tiled = nullptr;
  if (tile_rows.has_value()) {
    TORCH_CHECK(format <= Q8_0, "amity::block_linear: tiles take Q4_0, Q4_1 and Q8_0");
    TORCH_CHECK(tile_rows->scalar_type() == at::kBool && tile_rows->dim() == 1 && tile_rows->size(0) >= T &&
                    tile_rows->is_contiguous(),
                "amity::block_linear: tile_rows must be contiguous bool [>= T]");
    tiled = tile_rows->data_ptr<bool>();
    for (int64_t t = 0; t < T; ++t)
      if (runs.empty() || runs.back().second != tiled[t]) runs.emplace_back(t, tiled[t]);
  } else if (T > 0) {
    runs.emplace_back(0, false);
  }
  // A step's rows come as generated ones, then prompt chunks (the scheduler's order):
  // a few runs, each computed in place into its rows of `out`. Many runs (a
  // recomputed request's generated tokens inside its prompt chunk): each path's rows
  // gathered, computed apart and scattered back, two copies of the outputs.
  constexpr size_t kMostRunsInPlace = 4;
  if (runs.size() <= kMostRunsInPlace) {
    for (size_t i = 0; i < runs.size(); ++i) {
      const int64_t first = runs[i].first, end = i + 1 < runs.size() ? runs[i + 1].first : T;
      compute(first == 0 && end == T ? x32 : x32.narrow(0, first, end - first), runs[i].second, o + first * N);
    }
  } else {
    std::vector<int64_t> rows[2];  // on the int8 blocks, on tiles
    for (int64_t t = 0; t < T; ++t) rows[tiled[t]].push_back(t);
    for (int path = 0; path < 2; ++path) {
      const at::Tensor index = at::from_blob(rows[path].data(), {static_cast<int64_t>(rows[path].size())}, at::kLong);
      at::Tensor part = at::empty({index.size(0), N}, x32.options());
      compute(x32.index_select(0, index), path == 1, part.data_ptr<float>());
      out.index_copy_(0, index, part);
    }
  }
  if (bias32.defined()) out.add_(bias32);
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

TORCH_LIBRARY_FRAGMENT(amity, m) {
  m.def("block_linear(Tensor x, Tensor weight, int format, Tensor? bias, Tensor? tile_rows=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(amity, CPU, m) {
  m.impl("block_linear", &block_linear);
}
