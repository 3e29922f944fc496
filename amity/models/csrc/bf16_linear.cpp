// y = x W^T (+ bias) on the CPU with bfloat16 weights and activations and
// float32 sums: AVX512-BF16's vdpbf16ps, which multiplies 32 bfloat16 pairs and
// adds them into 16 float32 lanes in one instruction (twice float32 fma's work,
// from half the bytes). Activations are rounded to bfloat16 (to nearest, ties to
// even) once per token, so this is a scheme of its own: bfloat16 weights with
// float32 activations stay in packed_linear.cpp.
//
// Numbers: an output is one chain over the input pairs k = (0, 1), (2, 3), ...
// in order, in one lane, each step one vdpbf16ps (its two products, in the
// order the instruction defines), then one add of the bias. Few tokens
// (`direct`) and many (`blocked`, whose chains are stored and reloaded between
// blocks of k in float32, which changes no bit) run the same chain, so a token's
// outputs are the same bits whatever its batch, tile or thread.
//
// `tiles` (the `bf16-amx` scheme, CPUs with AMX: amx.cpp) runs every batch size
// on tiles instead: a tile step (TDPBF16PS) multiplies 16 tokens x 16 input pairs
// by 16 pairs x 16 outputs into float32 sums that stay in the tile until the
// last step. An output is one chain of tile steps over the pairs in order, each
// summing its 16 pairs in the unit's own fixed way; a token's row of a tile
// never mixes with the other rows, so its outputs are the same bits whatever its
// batch, as above. They are not vdpbf16ps's bits (the unit rounds differently),
// so a server runs one path or the other for every batch, never both. Tiles do
// a batch's arithmetic several times faster; one token's is bound by reading
// the weights, which the vector path does faster (benchmarks/README.md).
//
// Layout ([N / 32, K / 2, 64] bfloat16): panels of 32 outputs; in each, per input
// pair, outputs 0-15 then 16-31, each as (w[k], w[k + 1]): a row of a panel is
// two vectors of vdpbf16ps's 16 lanes x 2 inputs, and 16 rows at a stride of 128
// bytes are the tile of either half.

#include <torch/extension.h>

#include "panel_queue.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define AMITY_AVX512_BF16 1
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define AMITY_BF16_AMX 1
#endif
#endif

namespace amity {
at::Tensor contiguous_as(const at::Tensor& t, at::ScalarType dtype);  // packed_linear.cpp
bool amx_tiles();                                                     // amx.cpp
void amx_configure(int count, const uint8_t* rows, const uint16_t* colsb);
// Pair rows [k0, k0 + count) of a panel ([count, 64] bfloat16): in the weights, or
// written into buffer. k0 and count are multiples of 16 unless count reaches K2.
using PanelRows = const uint16_t* (*)(const void* weight, int64_t K2, int64_t panel, int64_t k0, int64_t count,
                                      uint16_t* buffer);
void tile_linear(const at::Tensor& x32, int64_t N, const void* weight, PanelRows panel_rows, bool parallel, float* out);
}
using amity::contiguous_as;

namespace {

constexpr int64_t NR = 32;   // outputs per panel
constexpr int MR = 12;       // tokens per register tile
constexpr int64_t KC = 128;  // input pairs per block of a blocked tile: 16 KiB of weights, in L1

// panels per direct tile for M tokens, as in packed_linear.cpp
constexpr int panels_for(int M) { return M == 1 ? 8 : M == 2 ? 4 : M == 3 ? 3 : M <= 6 ? 2 : 1; }

#ifdef AMITY_AVX512_BF16
using Acc = __m512;
inline Acc dot(Acc acc, const uint16_t* w, uint32_t x_pair) {
  return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(w), (__m512bh)_mm512_set1_epi32(static_cast<int>(x_pair)));
}
inline Acc zero() { return _mm512_setzero_ps(); }
inline Acc load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, Acc a) { _mm512_storeu_ps(p, a); }

// x [K] float32 -> K / 2 bfloat16 pairs, rounded to nearest even.
void round_token(const float* x, int64_t K, uint32_t* pairs) {
  for (int64_t k = 0; k < K; k += 32) {
    const __mmask16 lo = k + 16 <= K ? 0xFFFF : static_cast<__mmask16>((1u << (K - k)) - 1);
    const __mmask16 hi = k + 32 <= K ? 0xFFFF : k + 16 >= K ? 0 : static_cast<__mmask16>((1u << (K - k - 16)) - 1);
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + k + 16), _mm512_maskz_loadu_ps(lo, x + k));
    _mm512_mask_storeu_epi16(pairs + k / 2, static_cast<__mmask32>(lo) | (static_cast<__mmask32>(hi) << 16),
                             (__m512i)b);
  }
}
#else
// Other CPUs: the instruction's arithmetic, one lane at a time (bfloat16
// products are exact in float32, so each is an fma).
struct Acc { float v[16]; };
inline float bf16(uint16_t h) { uint32_t u = static_cast<uint32_t>(h) << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline Acc dot(Acc acc, const uint16_t* w, uint32_t x_pair) {
  const float x0 = bf16(x_pair & 0xFFFF), x1 = bf16(x_pair >> 16);
  for (int j = 0; j < 16; ++j) {
    acc.v[j] = std::fma(bf16(w[2 * j + 1]), x1, acc.v[j]);
    acc.v[j] = std::fma(bf16(w[2 * j]), x0, acc.v[j]);
  }
  return acc;
}
inline Acc zero() { return Acc{}; }
inline Acc load(const float* p) { Acc a; std::memcpy(a.v, p, sizeof a.v); return a; }
inline void store(float* p, Acc a) { std::memcpy(p, a.v, sizeof a.v); }
void round_token(const float* x, int64_t K, uint32_t* pairs) {
  auto* h = reinterpret_cast<c10::BFloat16*>(pairs);
  for (int64_t k = 0; k < K; ++k) h[k] = c10::BFloat16(x[k]);  // to nearest, ties to even
}
#endif

struct Problem {
  const uint32_t* x;  // [T, K / 2] bfloat16 pairs
  const uint16_t* w;  // [N / 32, K / 2, 64]
  float* out;         // [T, N]
  int64_t T, K2, N;   // K2: input pairs
};

// P panels x M tokens from token m0, input pairs [k0, k1), continuing the chains in
// out unless k0 is 0. `prefetch`: ask for each panel's rows about 1 KiB ahead. A
// blocked tile (many tokens, a block of k at a time) gains from it; a direct tile
// (few tokens over all of k) runs 1.1-1.2x faster without: the hardware
// prefetchers follow its streams, and the extra requests compete with them
// (benchmarks/README.md, session 26).
template <int P, int M, bool prefetch>
void tile(const Problem& pb, int64_t panel, int64_t m0, int64_t k0, int64_t k1) {
  Acc acc[M][P][2];
  for (int m = 0; m < M; ++m)
    for (int p = 0; p < P; ++p)
      for (int h = 0; h < 2; ++h)
        acc[m][p][h] = k0 == 0 ? zero() : load(pb.out + (m0 + m) * pb.N + (panel + p) * NR + h * 16);
  const int64_t panel_stride = pb.K2 * 2 * NR;
  for (int64_t k = k0; k < k1; ++k) {
    const uint16_t* row = pb.w + panel * panel_stride + k * 2 * NR;
#ifdef AMITY_AVX512_BF16
    if constexpr (prefetch)
      for (int p = 0; p < P; ++p)
        _mm_prefetch(reinterpret_cast<const char*>(row + p * panel_stride + 8 * 2 * NR), _MM_HINT_T0),
        _mm_prefetch(reinterpret_cast<const char*>(row + p * panel_stride + 8 * 2 * NR + 32), _MM_HINT_T0);
#endif
    for (int m = 0; m < M; ++m) {
      const uint32_t x_pair = pb.x[(m0 + m) * pb.K2 + k];
      for (int p = 0; p < P; ++p)
        for (int h = 0; h < 2; ++h) acc[m][p][h] = dot(acc[m][p][h], row + p * panel_stride + h * NR, x_pair);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int p = 0; p < P; ++p)
      for (int h = 0; h < 2; ++h) store(pb.out + (m0 + m) * pb.N + (panel + p) * NR + h * 16, acc[m][p][h]);
}

template <int M, int P>
void direct_of(int64_t size, const Problem& pb, int64_t panel) {
  if constexpr (P > 1)
    if (size < P) return direct_of<M, P - 1>(size, pb, panel);
  tile<P, M, false>(pb, panel, 0, 0, pb.K2);
}

// All T (<= MR) tokens over panels [begin, end), in tiles of at most panels_for(T).
template <int M>
void direct(const Problem& pb, int64_t begin, int64_t end) {
  constexpr int PMAX = panels_for(M);
  const int64_t count = end - begin, tiles = (count + PMAX - 1) / PMAX;
  for (int64_t t = 0, panel = begin; t < tiles; ++t) {
    const int64_t size = count / tiles + (t < count % tiles ? 1 : 0);
    direct_of<M, PMAX>(size, pb, panel);
    panel += size;
  }
}

template <int M>
void blocked_tokens(const Problem& pb, int64_t panel, int64_t m0, int64_t k0, int64_t k1) {
  tile<1, M, true>(pb, panel, m0, k0, k1);
}

void blocked(const Problem& pb, int64_t begin, int64_t end) {
  for (int64_t panel = begin; panel < end; ++panel)
    for (int64_t k0 = 0; k0 < pb.K2; k0 += KC) {
      const int64_t k1 = std::min(pb.K2, k0 + KC);
      int64_t m0 = 0;
      for (; m0 + MR <= pb.T; m0 += MR) blocked_tokens<MR>(pb, panel, m0, k0, k1);
      switch (pb.T - m0) {
#define AMITY_TAIL(M) case M: blocked_tokens<M>(pb, panel, m0, k0, k1); break;
        AMITY_TAIL(1) AMITY_TAIL(2) AMITY_TAIL(3) AMITY_TAIL(4) AMITY_TAIL(5) AMITY_TAIL(6)
        AMITY_TAIL(7) AMITY_TAIL(8) AMITY_TAIL(9) AMITY_TAIL(10) AMITY_TAIL(11)
#undef AMITY_TAIL
        default: break;
      }
    }
}

// Every T on AVX512-BF16 (or its arithmetic, lane by lane): direct tiles for up to
// MR tokens, blocked ones for more.
at::Tensor vector_linear(const at::Tensor& x32, const at::Tensor& weight, bool parallel) {
  const int64_t T = x32.size(0), K = x32.size(1), N = weight.size(0) * NR;
  at::Tensor pairs = at::empty({T, K / 2}, x32.options().dtype(at::kInt));
  at::Tensor out = at::empty({T, N}, x32.options());
  const float* xp = x32.data_ptr<float>();
  uint32_t* pp = reinterpret_cast<uint32_t*>(pairs.data_ptr<int32_t>());
  for (int64_t t = 0; t < T; ++t) round_token(xp + t * K, K, pp + t * (K / 2));
  const Problem pb{pp, reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()), out.data_ptr<float>(),
                   T, K / 2, N};
  const int64_t num_panels = N / NR;
  // Tasks of a few panels shared out by PanelQueue, as in packed_linear.cpp.
  const int64_t panels_per_task = T <= MR ? std::max(panels_for(static_cast<int>(T)), 4) : 1;
  const int64_t num_tasks = (num_panels + panels_per_task - 1) / panels_per_task;
  amity::PanelQueue tasks(num_tasks, parallel);
#pragma omp parallel if (parallel)
  for (int64_t task; (task = tasks.next()) >= 0;) {
    const int64_t begin = task * panels_per_task, end = std::min(begin + panels_per_task, num_panels);
    switch (T) {
#define AMITY_DIRECT(M) case M: direct<M>(pb, begin, end); break;
      AMITY_DIRECT(1) AMITY_DIRECT(2) AMITY_DIRECT(3) AMITY_DIRECT(4) AMITY_DIRECT(5) AMITY_DIRECT(6)
      AMITY_DIRECT(7) AMITY_DIRECT(8) AMITY_DIRECT(9) AMITY_DIRECT(10) AMITY_DIRECT(11) AMITY_DIRECT(12)
#undef AMITY_DIRECT
      default: blocked(pb, begin, end);  // more than MR tokens
    }
  }
  return out;
}

#ifdef AMITY_BF16_AMX
constexpr int64_t TM = 16;  // tokens per tile
constexpr int64_t KT = 16;  // input pairs per tile step
constexpr int64_t TB = 512;  // tokens per task (measured: 128-1024 best; fewer dequantize a panel more often)

// A tile of sums (16 tokens x 16 outputs) into out's rows, the first `rows` of them
// (out has no rows past T). A macro: a tile instruction names its tile literally.
#define AMITY_STORE_SUMS(TILE, out, N, rows)                                                   \
  do {                                                                                         \
    if ((rows) >= TM) {                                                                        \
      _tile_stored(TILE, out, (N) * 4);                                                        \
    } else {                                                                                   \
      alignas(64) float scratch[TM * 16];                                                      \
      _tile_stored(TILE, scratch, 16 * 4);                                                     \
      for (int64_t r = 0; r < (rows); ++r) std::memcpy((out) + r * (N), scratch + r * 16, 64); \
    }                                                                                          \
  } while (0)

// TILES x 16 tokens from token m0 (x's rows and columns zero-padded to whole tiles)
// for one panel, every input pair, its pair rows `chunk` at a time from panel_rows
// (source_panel of weight): tiles 0-3 the sums (token tile i, half h at 2i + h),
// 4 and 5 the tokens' pairs, 6 and 7 the panel's halves.
template <int TILES>
void amx_tile(const Problem& pb, int64_t K2_padded, const void* weight, amity::PanelRows panel_rows,
              int64_t source_panel, int64_t chunk, uint16_t* buffer, int64_t panel, int64_t m0) {
  constexpr int64_t stride = 2 * NR * 2;  // bytes from one pair's row of a panel to the next
  const uint32_t* x = pb.x + m0 * K2_padded;
  const uint16_t* w = nullptr;
  alignas(64) uint16_t tail[KT * 2 * NR];
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (TILES == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t k0 = 0; k0 < pb.K2; k0 += KT) {
    if (k0 % chunk == 0) w = panel_rows(weight, pb.K2, source_panel, k0, std::min(chunk, pb.K2 - k0), buffer) - k0 * 2 * NR;
    const uint16_t* rows = w + k0 * 2 * NR;
    if (k0 + KT > pb.K2) {  // the last step's pairs past K2 as zeros
      std::memset(tail, 0, sizeof tail);
      std::memcpy(tail, rows, (pb.K2 - k0) * stride);
      // gcc's _tile_loadd is an asm statement that does not say it reads memory: a
      // local buffer written only for it may be dropped as never read, or the
      // writes moved past it. This compiler barrier keeps them before the load.
      __asm__ volatile("" ::: "memory");
      rows = tail;
    }
    _tile_loadd(6, rows, stride);
    _tile_loadd(7, rows + 16 * 2, stride);
    _tile_loadd(4, x + k0, K2_padded * 4);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (TILES == 2) {
      _tile_loadd(5, x + TM * K2_padded + k0, K2_padded * 4);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  float* o = pb.out + m0 * pb.N + panel * NR;
  AMITY_STORE_SUMS(0, o, pb.N, pb.T - m0);
  AMITY_STORE_SUMS(1, o + 16, pb.N, pb.T - m0);
  if constexpr (TILES == 2) {
    AMITY_STORE_SUMS(2, o + TM * pb.N, pb.N, pb.T - m0 - TM);
    AMITY_STORE_SUMS(3, o + TM * pb.N + 16, pb.N, pb.T - m0 - TM);
  }
}

const uint16_t* bf16_panel(const void* weight, int64_t K2, int64_t panel, int64_t k0, int64_t, uint16_t*) {
  return static_cast<const uint16_t*>(weight) + (panel * K2 + k0) * 2 * NR;
}
#endif

}  // namespace

#ifdef AMITY_BF16_AMX
namespace amity {
// Every T on tiles: x rounded to pairs in [T up to 16s, K2 up to 16s] with zeros
// around; tasks of one panel and up to TB tokens, shared out by PanelQueue in the
// order of every panel of one token block before the next block (so a thread owns
// whole token blocks), 32 tokens at a time, so that two tiles of tokens share each
// load of the panel. `panel_rows` gives the panel's pair rows
// (bf16_linear: pointers into the weights; block_linear.cpp: dequantized into the
// thread's buffer), a step at a time for one pass of tokens, else the whole panel
// once for all the task's passes. Writes x's T rows of N outputs to `out`, N floats
// apart (a caller's rows of a wider batch).
void tile_linear(const at::Tensor& x32, int64_t N, const void* weight, PanelRows panel_rows, bool parallel, float* out) {
  const int64_t T = x32.size(0), K = x32.size(1), K2 = K / 2;
  const int64_t T_padded = (T + TM - 1) / TM * TM, K2_padded = (K2 + KT - 1) / KT * KT;
  at::Tensor pairs = at::empty({T_padded, K2_padded}, x32.options().dtype(at::kInt));
  const float* xp = x32.data_ptr<float>();
  uint32_t* pp = reinterpret_cast<uint32_t*>(pairs.data_ptr<int32_t>());
  const Problem pb{pp, nullptr, out, T, K2, N};
  const int64_t num_panels = N / NR, token_tasks = (T_padded + TB - 1) / TB;
  amity::PanelQueue tasks(num_panels * token_tasks, parallel);
#pragma omp parallel if (parallel)
  {
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T_padded; ++t) {  // the padding zeroed, the rest written once
      uint32_t* row = pp + t * K2_padded;
      if (t < T) round_token(xp + t * K, K, row);
      std::fill(row + (t < T ? K2 : 0), row + K2_padded, 0u);
    }
    const uint8_t rows[8] = {TM, TM, TM, TM, TM, TM, KT, KT};
    const uint16_t colsb[8] = {64, 64, 64, 64, KT * 4, KT * 4, 64, 64};
    amity::amx_configure(8, rows, colsb);
    thread_local std::vector<uint16_t> buffer;  // OpenMP's threads persist: grown once, never cleared
    if (buffer.size() < static_cast<size_t>(K2 * 2 * NR)) buffer.resize(K2 * 2 * NR);
    for (int64_t task; (task = tasks.next()) >= 0;) {
      const int64_t panel = task % num_panels, first = task / num_panels * TB;
      const int64_t last = std::min(first + TB, T_padded);
      // One pass of tokens: the panel a step at a time (dequantized rows stay in
      // L1); more: the whole panel once, which every pass then reads.
      const uint16_t* whole = last - first > 2 * TM ? panel_rows(weight, K2, panel, 0, K2, buffer.data()) : nullptr;
      const void* source = whole ? static_cast<const void*>(whole) : weight;
      const amity::PanelRows rows = whole ? bf16_panel : panel_rows;
      const int64_t chunk = whole ? K2 : KT, at = whole ? 0 : panel;
      for (int64_t m0 = first; m0 < last; m0 += 2 * TM) {
        if (m0 + TM < last) amx_tile<2>(pb, K2_padded, source, rows, at, chunk, buffer.data(), panel, m0);
        else amx_tile<1>(pb, K2_padded, source, rows, at, chunk, buffer.data(), panel, m0);
      }
    }
    _tile_release();
  }
}
}  // namespace amity
#endif

// x [T, K] float32 or bfloat16; weight [N / 32, K / 2, 64] bfloat16 as above (K
// even); bias [N] or undefined; tiles: AMX (`bf16-amx`) rather than vdpbf16ps
// (`bf16`). Returns [T, N] in x's dtype.
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       bool tiles) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "amity::bf16_linear takes a 2-D CPU input");
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.dim() == 3 && weight.size(2) == 2 * NR &&
                  weight.is_contiguous(),
              "amity::bf16_linear: weight must be contiguous bfloat16 [N / 32, K / 2, 64]");
  TORCH_CHECK(weight.size(1) * 2 == x.size(1), "weight and input disagree on in_features");
  const int64_t T = x.size(0);
  const at::Tensor x32 = contiguous_as(x, at::kFloat);
  const at::Tensor bias32 = bias.has_value() ? contiguous_as(*bias, at::kFloat) : at::Tensor();
  const bool parallel = T > 0 && weight.numel() * 2 >= (128 << 10);  // waking a thread pays past ~64 KiB each
  at::Tensor out;
  if (tiles) {
#ifdef AMITY_BF16_AMX
    TORCH_CHECK(amity::amx_tiles(), "amity::bf16_linear: Linux refused this process AMX's tile state");
    out = at::empty({T, weight.size(0) * NR}, x32.options());
    amity::tile_linear(x32, weight.size(0) * NR, weight.data_ptr<at::BFloat16>(), bf16_panel, parallel,
                       out.data_ptr<float>());
#else
    TORCH_CHECK(false, "amity::bf16_linear: tiles need a CPU with AMX-BF16 (this build has none)");
#endif
  } else {
    out = vector_linear(x32, weight, parallel);
  }
  if (bias32.defined()) out.add_(bias32);
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

TORCH_LIBRARY_FRAGMENT(amity, m) {
  m.def("bf16_linear(Tensor x, Tensor weight, Tensor? bias, bool tiles=False) -> Tensor");
}

TORCH_LIBRARY_IMPL(amity, CPU, m) {
  m.impl("bf16_linear", &bf16_linear);
}
