// y = x W^T (* scale) (+ bias) on the CPU, for weights packed in panels of 32
// output rows: [N / 32, K, 32], as int8 (with one float scale per output row),
// bfloat16 or float32. Activations are float32 or bfloat16; the arithmetic is
// float32 throughout.
//
// torch's own CPU matmuls run a decode step's few tokens far below memory speed
// (benchmarks/README.md), and its weight-only int8 and int4 kernels more so. The
// panel layout lets one kernel serve every batch size:
// - an output element is one fma chain over k = 0 .. K-1, in order, in one lane
//   of a 16-float vector, then one explicit fma for scale and bias. Whatever the
//   tile, the thread split or the other tokens of the batch, a token's outputs
//   are the same bits, so batching never changes a request's numbers;
// - a panel's row k is 32 adjacent weights, widened into two vectors and
//   multiplied by one broadcast activation per token. Few tokens (`direct`)
//   stream the weights once from memory, several panels at a time so that
//   enough chains are in flight; many tokens (`blocked`) widen a block of a
//   panel into an L1 buffer once and run 12-token register tiles over it, which
//   is compute-bound: two vector loads and twelve broadcasts feed 24 fmas.

#include <torch/extension.h>

#include "panel_queue.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

constexpr int64_t NR = 32;   // output rows per panel
constexpr int MR = 12;       // tokens per register tile
constexpr int64_t KC = 128;  // k per widened block: 16 KiB of float32, in L1

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

// Widen the 32 weights of panel row k into two float32 vectors.
inline void widen(const int8_t* w, __m512& lo, __m512& hi) {
  lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))));
  hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16))));
}
inline __m512 bf16_to_float(const c10::BFloat16* w) {
  const __m512i halves = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(halves, 16));
}
inline void widen(const c10::BFloat16* w, __m512& lo, __m512& hi) {
  lo = bf16_to_float(w);
  hi = bf16_to_float(w + 16);
}
inline void widen(const float* w, __m512& lo, __m512& hi) {
  lo = _mm512_loadu_ps(w);
  hi = _mm512_loadu_ps(w + 16);
}

// P panels (`panel_stride` elements apart) x M tokens, every k: the
// accumulators are written raw to acc[m][p * NR + j].
template <typename W, int P, int M>
void direct_tile(const float* x, int64_t K, const W* w, int64_t panel_stride, float* acc_out) {
  __m512 acc[M][P][2];
  for (int m = 0; m < M; ++m)
    for (int p = 0; p < P; ++p) acc[m][p][0] = acc[m][p][1] = _mm512_setzero_ps();
  // About 1 KiB ahead in each panel's stream: one core's demand misses alone
  // read memory at a fraction of its bandwidth on this kind of machine.
  constexpr int64_t kAhead = 1024 / (NR * sizeof(W)) + 1;
  for (int64_t k = 0; k < K; ++k) {
    __m512 lo[P], hi[P];
    for (int p = 0; p < P; ++p) {
      const W* row = w + p * panel_stride + k * NR;
      _mm_prefetch(reinterpret_cast<const char*>(row + kAhead * NR), _MM_HINT_T0);
      if constexpr (sizeof(W) == 4)
        _mm_prefetch(reinterpret_cast<const char*>(row + kAhead * NR + 16), _MM_HINT_T0);
      widen(row, lo[p], hi[p]);
    }
    for (int m = 0; m < M; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * K + k]);
      for (int p = 0; p < P; ++p) {
        acc[m][p][0] = _mm512_fmadd_ps(lo[p], xb, acc[m][p][0]);
        acc[m][p][1] = _mm512_fmadd_ps(hi[p], xb, acc[m][p][1]);
      }
    }
  }
  for (int m = 0; m < M; ++m)
    for (int p = 0; p < P; ++p) {
      _mm512_storeu_ps(acc_out + (m * P + p) * NR, acc[m][p][0]);
      _mm512_storeu_ps(acc_out + (m * P + p) * NR + 16, acc[m][p][1]);
    }
}

// M tokens over one widened block of `kc` panel rows (buf [kc][NR] float32),
// continuing the chains held in c (row stride ldc) unless `first`.
template <int M>
void blocked_tile(const float* x, int64_t K, const float* buf, int64_t kc, float* c, int64_t ldc, bool first) {
  __m512 acc[M][2];
  for (int m = 0; m < M; ++m) {
    acc[m][0] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + m * ldc);
    acc[m][1] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(c + m * ldc + 16);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 lo = _mm512_loadu_ps(buf + k * NR), hi = _mm512_loadu_ps(buf + k * NR + 16);
    for (int m = 0; m < M; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * K + k]);
      acc[m][0] = _mm512_fmadd_ps(lo, xb, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(hi, xb, acc[m][1]);
    }
  }
  for (int m = 0; m < M; ++m) {
    _mm512_storeu_ps(c + m * ldc, acc[m][0]);
    _mm512_storeu_ps(c + m * ldc + 16, acc[m][1]);
  }
}

template <typename W>
void widen_block(const W* w, int64_t kc, float* buf) {
  for (int64_t k = 0; k < kc; ++k) {
    __m512 lo, hi;
    widen(w + k * NR, lo, hi);
    _mm512_storeu_ps(buf + k * NR, lo);
    _mm512_storeu_ps(buf + k * NR + 16, hi);
  }
}

// out = acc * scale + bias, one explicit fma per element (left to the compiler,
// a multiply and an add may or may not be contracted, differently per copy).
inline void finish(const float* acc, const float* scale, const float* bias, float* out) {
  for (int j = 0; j < NR; j += 16) {
    const __m512 s = scale ? _mm512_loadu_ps(scale + j) : _mm512_set1_ps(1.f);
    const __m512 b = bias ? _mm512_loadu_ps(bias + j) : _mm512_setzero_ps();
    _mm512_storeu_ps(out + j, _mm512_fmadd_ps(_mm512_loadu_ps(acc + j), s, b));
  }
}
#else
// Other CPUs: the same chains in plain C++, one output at a time.
inline float to_float(int8_t v) { return static_cast<float>(v); }
inline float to_float(c10::BFloat16 v) { return static_cast<float>(v); }
inline float to_float(float v) { return v; }

template <typename W, int P, int M>
void direct_tile(const float* x, int64_t K, const W* w, int64_t panel_stride, float* acc_out) {
  for (int m = 0; m < M; ++m)
    for (int p = 0; p < P; ++p)
      for (int64_t j = 0; j < NR; ++j) {
        float a = 0.f;
        for (int64_t k = 0; k < K; ++k) a = std::fma(to_float(w[p * panel_stride + k * NR + j]), x[m * K + k], a);
        acc_out[(m * P + p) * NR + j] = a;
      }
}
template <int M>
void blocked_tile(const float* x, int64_t K, const float* buf, int64_t kc, float* c, int64_t ldc, bool first) {
  for (int m = 0; m < M; ++m)
    for (int64_t j = 0; j < NR; ++j) {
      float a = first ? 0.f : c[m * ldc + j];
      for (int64_t k = 0; k < kc; ++k) a = std::fma(buf[k * NR + j], x[m * K + k], a);
      c[m * ldc + j] = a;
    }
}
template <typename W>
void widen_block(const W* w, int64_t kc, float* buf) {
  for (int64_t i = 0; i < kc * NR; ++i) buf[i] = to_float(w[i]);
}
inline void finish(const float* acc, const float* scale, const float* bias, float* out) {
  for (int j = 0; j < NR; ++j) out[j] = std::fma(acc[j], scale ? scale[j] : 1.f, bias ? bias[j] : 0.f);
}
#endif

struct Problem {
  const float* x;      // [T, K]
  const float* scale;  // [N] or null
  const float* bias;   // [N] or null
  float* out;          // [T, N]
  int64_t T, K, N;
};

// Panels per direct tile for M tokens: enough chains in flight (8+) without
// spilling the 32 vector registers (accumulators + widened weights). One token
// takes 8 panels: a core reads memory faster the more weight streams it has in
// flight, and a decode step's 120 matrices ran about 4% faster than with 4
// (seven A/B pairs, benchmarks/README.md).
constexpr int panels_for(int M) { return M == 1 ? 8 : M == 2 ? 4 : M == 3 ? 3 : M <= 6 ? 2 : 1; }

// direct_tile with P = size, for 1 <= size <= PMAX.
template <typename W, int M, int P>
void direct_tile_of(int64_t size, const float* x, int64_t K, const W* w, int64_t panel_stride, float* acc) {
  if constexpr (P > 1)
    if (size < P) return direct_tile_of<W, M, P - 1>(size, x, K, w, panel_stride, acc);
  direct_tile<W, P, M>(x, K, w, panel_stride, acc);
}

template <typename W, int M>
void direct_panels(const Problem& pb, const W* weight, int64_t begin, int64_t end) {
  constexpr int PMAX = panels_for(M);
  float acc[M * PMAX * NR];
  const int64_t panel_stride = pb.K * NR;
  // Split [begin, end) into tiles of at most PMAX panels, as even as possible.
  const int64_t count = end - begin, tiles = (count + PMAX - 1) / PMAX;
  int64_t panel = begin;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t size = count / tiles + (t < count % tiles ? 1 : 0);
    const W* w = weight + panel * panel_stride;
    direct_tile_of<W, M, PMAX>(size, pb.x, pb.K, w, panel_stride, acc);
    for (int m = 0; m < M; ++m)
      for (int64_t p = 0; p < size; ++p) {
        const int64_t n = (panel + p) * NR;
        finish(acc + (m * size + p) * NR, pb.scale ? pb.scale + n : nullptr, pb.bias ? pb.bias + n : nullptr,
               pb.out + m * pb.N + n);
      }
    panel += size;
  }
}

template <int M>
void blocked_tokens(const Problem& pb, const float* buf, int64_t k0, int64_t kc, int64_t m0, float* c) {
  blocked_tile<M>(pb.x + m0 * pb.K + k0, pb.K, buf, kc, c, pb.N, k0 == 0);
}

template <typename W>
void blocked_panels(const Problem& pb, const W* weight, int64_t begin, int64_t end) {
  alignas(64) float buf[KC * NR];
  for (int64_t panel = begin; panel < end; ++panel) {
    const W* w = weight + panel * pb.K * NR;
    const int64_t n = panel * NR;
    for (int64_t k0 = 0; k0 < pb.K; k0 += KC) {
      const int64_t kc = std::min(KC, pb.K - k0);
      widen_block(w + k0 * NR, kc, buf);
      int64_t m0 = 0;
      for (; m0 + MR <= pb.T; m0 += MR) blocked_tokens<MR>(pb, buf, k0, kc, m0, pb.out + m0 * pb.N + n);
      float* c = pb.out + m0 * pb.N + n;
      switch (pb.T - m0) {
#define AMITY_TAIL(M) case M: blocked_tokens<M>(pb, buf, k0, kc, m0, c); break;
        AMITY_TAIL(1) AMITY_TAIL(2) AMITY_TAIL(3) AMITY_TAIL(4) AMITY_TAIL(5) AMITY_TAIL(6)
        AMITY_TAIL(7) AMITY_TAIL(8) AMITY_TAIL(9) AMITY_TAIL(10) AMITY_TAIL(11)
#undef AMITY_TAIL
        default: break;
      }
    }
    for (int64_t m = 0; m < pb.T; ++m) {
      float* row = pb.out + m * pb.N + n;
      finish(row, pb.scale ? pb.scale + n : nullptr, pb.bias ? pb.bias + n : nullptr, row);
    }
  }
}

// Tasks of a few panels, shared out by PanelQueue (panel_queue.h): each thread
// streams its own run of panels, and takes up another's when the scheduler gives
// that one's core to the server's event loop.
template <typename W>
void run(const Problem& pb, const W* weight) {
  const int64_t num_panels = pb.N / NR;
  // One direct tile of the widest kind for these tokens (at least 4 panels), or a blocked panel.
  const int64_t panels_per_task = pb.T <= MR ? std::max(panels_for(static_cast<int>(pb.T)), 4) : 1;
  const int64_t num_tasks = (num_panels + panels_per_task - 1) / panels_per_task;
  // Waking the second thread pays past about 64 KiB of weights each.
  const bool parallel = num_panels * pb.K * NR * static_cast<int64_t>(sizeof(W)) >= (128 << 10);
  amity::PanelQueue tasks(num_tasks, parallel);
#pragma omp parallel if (parallel)
  for (int64_t task; (task = tasks.next()) >= 0;) {
    const int64_t begin = task * panels_per_task, end = std::min(begin + panels_per_task, num_panels);
    switch (pb.T) {
#define AMITY_DIRECT(M) case M: direct_panels<W, M>(pb, weight, begin, end); break;
      AMITY_DIRECT(1) AMITY_DIRECT(2) AMITY_DIRECT(3) AMITY_DIRECT(4) AMITY_DIRECT(5) AMITY_DIRECT(6)
      AMITY_DIRECT(7) AMITY_DIRECT(8) AMITY_DIRECT(9) AMITY_DIRECT(10) AMITY_DIRECT(11) AMITY_DIRECT(12)
#undef AMITY_DIRECT
      default: blocked_panels<W>(pb, weight, begin, end);  // more than MR tokens
    }
  }
}

}  // namespace

namespace amity {
// t as a contiguous tensor of dtype, t itself when it already is one: a no-op `to`
// still costs a dispatcher call, and a decode step makes a few per op and layer.
// (Also used by paged_attention.cpp.)
at::Tensor contiguous_as(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype && t.is_contiguous() ? t : t.to(dtype).contiguous();
}
}  // namespace amity

using amity::contiguous_as;

// x [T, K] float32 or bfloat16; weight [N / 32, K, 32] int8, bfloat16 or float32;
// scale [N] float32 (int8 weights only); bias [N] or undefined. Returns [T, N] in
// x's dtype.
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& scale,
                         const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "amity::packed_linear takes a 2-D CPU input");
  TORCH_CHECK(weight.dim() == 3 && weight.size(2) == NR && weight.is_contiguous(),
              "amity::packed_linear: weight must be contiguous [N / 32, K, 32]");
  TORCH_CHECK(weight.size(1) == x.size(1), "weight and input disagree on in_features");
  const auto wtype = weight.scalar_type();
  TORCH_CHECK(wtype == at::kChar || wtype == at::kBFloat16 || wtype == at::kFloat,
              "amity::packed_linear: weight is int8, bfloat16 or float32");
  TORCH_CHECK((wtype == at::kChar) == scale.has_value(), "amity::packed_linear: int8 weights need a scale, and only they");
  const at::Tensor x32 = contiguous_as(x, at::kFloat);
  const at::Tensor scale32 = scale.has_value() ? contiguous_as(*scale, at::kFloat) : at::Tensor();
  const at::Tensor bias32 = bias.has_value() ? contiguous_as(*bias, at::kFloat) : at::Tensor();
  const int64_t T = x.size(0), K = x.size(1), N = weight.size(0) * NR;
  at::Tensor out = at::empty({T, N}, x32.options());
  const Problem pb{x32.data_ptr<float>(), scale32.defined() ? scale32.data_ptr<float>() : nullptr,
                   bias32.defined() ? bias32.data_ptr<float>() : nullptr, out.data_ptr<float>(), T, K, N};
  if (T > 0) {
    if (wtype == at::kChar) run(pb, weight.data_ptr<int8_t>());
    else if (wtype == at::kBFloat16) run(pb, weight.data_ptr<c10::BFloat16>());
    else run(pb, weight.data_ptr<float>());
  }
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

TORCH_LIBRARY_FRAGMENT(amity, m) {
  m.def("packed_linear(Tensor x, Tensor weight, Tensor? scale, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(amity, CPU, m) {
  m.impl("packed_linear", &packed_linear);
}
