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
// Layout ([N / 32, K / 2, 64] bfloat16): panels of 32 outputs; in each, per input
// pair, outputs 0-15 then 16-31, each as (w[k], w[k + 1]): a row of a panel is
// two vectors of vdpbf16ps's 16 lanes x 2 inputs.

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define AMITY_AVX512_BF16 1
#endif

namespace amity {
at::Tensor contiguous_as(const at::Tensor& t, at::ScalarType dtype);  // packed_linear.cpp
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
  const float* bias;  // [N] or null
  float* out;         // [T, N]
  int64_t T, K2, N;   // K2: input pairs
};

// P panels x M tokens from token m0, input pairs [k0, k1), continuing the chains in
// out unless k0 is 0.
template <int P, int M>
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
    for (int p = 0; p < P; ++p)  // about 1 KiB ahead in each panel's stream
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
  tile<P, M>(pb, panel, 0, 0, pb.K2);
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
  tile<1, M>(pb, panel, m0, k0, k1);
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

}  // namespace

// x [T, K] float32 or bfloat16; weight [N / 32, K / 2, 64] bfloat16 as above (K
// even); bias [N] or undefined. Returns [T, N] in x's dtype.
at::Tensor bf16_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "amity::bf16_linear takes a 2-D CPU input");
  TORCH_CHECK(weight.scalar_type() == at::kBFloat16 && weight.dim() == 3 && weight.size(2) == 2 * NR &&
                  weight.is_contiguous(),
              "amity::bf16_linear: weight must be contiguous bfloat16 [N / 32, K / 2, 64]");
  TORCH_CHECK(weight.size(1) * 2 == x.size(1), "weight and input disagree on in_features");
  const int64_t T = x.size(0), K = x.size(1), N = weight.size(0) * NR;
  const at::Tensor x32 = contiguous_as(x, at::kFloat);
  const at::Tensor bias32 = bias.has_value() ? contiguous_as(*bias, at::kFloat) : at::Tensor();
  at::Tensor pairs = at::empty({T, K / 2}, x.options().dtype(at::kInt));
  at::Tensor out = at::empty({T, N}, x32.options());
  const float* xp = x32.data_ptr<float>();
  uint32_t* pp = reinterpret_cast<uint32_t*>(pairs.data_ptr<int32_t>());
  for (int64_t t = 0; t < T; ++t) round_token(xp + t * K, K, pp + t * (K / 2));
  const Problem pb{pp, reinterpret_cast<const uint16_t*>(weight.data_ptr<at::BFloat16>()),
                   bias32.defined() ? bias32.data_ptr<float>() : nullptr, out.data_ptr<float>(), T, K / 2, N};
  const int64_t num_panels = N / NR;
  // Tasks of a few panels handed out one at a time, as in packed_linear.cpp.
  const int64_t panels_per_task = T <= MR ? std::max(panels_for(static_cast<int>(T)), 4) : 1;
  const int64_t num_tasks = (num_panels + panels_per_task - 1) / panels_per_task;
  const bool parallel = T > 0 && weight.numel() * 2 >= (128 << 10);  // waking a thread pays past ~64 KiB each
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t task = 0; task < num_tasks; ++task) {
    const int64_t begin = task * panels_per_task, end = std::min(begin + panels_per_task, num_panels);
    switch (T) {
#define AMITY_DIRECT(M) case M: direct<M>(pb, begin, end); break;
      AMITY_DIRECT(1) AMITY_DIRECT(2) AMITY_DIRECT(3) AMITY_DIRECT(4) AMITY_DIRECT(5) AMITY_DIRECT(6)
      AMITY_DIRECT(7) AMITY_DIRECT(8) AMITY_DIRECT(9) AMITY_DIRECT(10) AMITY_DIRECT(11) AMITY_DIRECT(12)
#undef AMITY_DIRECT
      default: blocked(pb, begin, end);  // more than MR tokens
    }
  }
  if (pb.bias)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t n = 0; n < N; ++n) pb.out[t * N + n] += pb.bias[n];
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

TORCH_LIBRARY_FRAGMENT(amity, m) {
  m.def("bf16_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(amity, CPU, m) {
  m.impl("bf16_linear", &bf16_linear);
}
