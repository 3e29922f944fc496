// y = x W^T * scale (+ bias) for int8 weights with one scale per output row, on
// the CPU, for float32 or bfloat16 activations: weight-only int8.
//
// At the few tokens of a decode step a linear layer is bound by reading its
// weights, and torch's own weight-only kernels read them several times slower
// than memory allows (benchmarks/README.md). Here weights are widened to float
// in AVX-512 registers and each widened vector is multiplied into several dot
// products at once (see `tile`); other CPUs get the same loops in plain C++. Every token's result is the same float computation
// whatever else is in its batch, so batching does not change a request's numbers.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace {

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

// A tile of ROWS weight rows by TOKENS tokens: ROWS * TOKENS float accumulators
// of 16 lanes, so that a widened weight vector feeds TOKENS FMAs and each token's
// activations feed ROWS. k runs in steps of 16; in_features % 16 == 0 is checked.
constexpr int PREFETCH_ROWS = 16;

template <int ROWS, int TOKENS>
inline void tile(const float* x, const int8_t* w, int64_t in_features, float* sums) {
  __m512 acc[ROWS][TOKENS];
  for (int r = 0; r < ROWS; ++r)
    for (int t = 0; t < TOKENS; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < in_features; k += 16) {
    __m512 xs[TOKENS];
    for (int t = 0; t < TOKENS; ++t) xs[t] = _mm512_loadu_ps(x + t * in_features + k);
    // Ask for the weights a few tiles ahead: one core's demand misses alone
    // stream at a fraction of the memory bandwidth on this kind of machine.
    if (k % 64 == 0)
      for (int r = 0; r < ROWS; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(w + (r + PREFETCH_ROWS) * in_features + k), _MM_HINT_T0);
    for (int r = 0; r < ROWS; ++r) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * in_features + k));
      const __m512 wf = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes));
      for (int t = 0; t < TOKENS; ++t) acc[r][t] = _mm512_fmadd_ps(wf, xs[t], acc[r][t]);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int t = 0; t < TOKENS; ++t) sums[r * TOKENS + t] = _mm512_reduce_add_ps(acc[r][t]);
}
constexpr bool kVectorized = true;
#else
template <int ROWS, int TOKENS>
inline void tile(const float* x, const int8_t* w, int64_t in_features, float* sums) {
  for (int r = 0; r < ROWS; ++r)
    for (int t = 0; t < TOKENS; ++t) {
      float a = 0.f;
      for (int64_t k = 0; k < in_features; ++k)
        a += static_cast<float>(w[r * in_features + k]) * x[t * in_features + k];
      sums[r * TOKENS + t] = a;
    }
}
constexpr bool kVectorized = false;
#endif

// Rows [row_begin, row_end) for every token: 4-row tiles of one token at a time
// for a single token (memory-bound: four independent sums in flight), 2-row tiles
// of 4 tokens otherwise (each widened weight vector used four times).
void int8_rows(const float* x, const int8_t* weight, const float* scale, const float* bias,
               float* out, int64_t num_tokens, int64_t in_features, int64_t out_features,
               int64_t row_begin, int64_t row_end) {
  float sums[8];
  // One explicit fma: left to the compiler, each tile's copy of this line may or
  // may not be contracted, and a token's result would depend on its tile.
  auto store = [&](int64_t n, int64_t m, float sum) {
    out[m * out_features + n] = std::fma(sum, scale[n], bias ? bias[n] : 0.f);
  };
  int64_t n = row_begin;
  if (num_tokens == 1) {
    for (; n + 4 <= row_end; n += 4) {
      tile<4, 1>(x, weight + n * in_features, in_features, sums);
      for (int r = 0; r < 4; ++r) store(n + r, 0, sums[r]);
    }
  } else {
    for (; n + 2 <= row_end; n += 2) {
      int64_t m = 0;
      for (; m + 4 <= num_tokens; m += 4) {
        tile<2, 4>(x + m * in_features, weight + n * in_features, in_features, sums);
        for (int r = 0; r < 2; ++r)
          for (int t = 0; t < 4; ++t) store(n + r, m + t, sums[r * 4 + t]);
      }
      for (; m < num_tokens; ++m) {
        tile<2, 1>(x + m * in_features, weight + n * in_features, in_features, sums);
        for (int r = 0; r < 2; ++r) store(n + r, m, sums[r]);
      }
    }
  }
  for (; n < row_end; ++n)  // the rows left over from the tiles
    for (int64_t m = 0; m < num_tokens; ++m) {
      tile<1, 1>(x + m * in_features, weight + n * in_features, in_features, sums);
      store(n, m, sums[0]);
    }
}

}  // namespace

// x [M, K] float32 or bfloat16; weight [N, K] int8; scale [N] float32; bias [N]
// float32 or undefined. Returns [M, N] in x's dtype.
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                       const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "amity::int8_linear takes a 2-D CPU input");
  TORCH_CHECK(weight.scalar_type() == at::kChar && weight.is_contiguous(), "weight: contiguous int8");
  TORCH_CHECK(weight.size(1) == x.size(1), "weight and input disagree on in_features");
  TORCH_CHECK(!kVectorized || x.size(1) % 16 == 0, "amity::int8_linear needs in_features % 16 == 0");
  const at::Tensor x32 = x.to(at::kFloat).contiguous();
  const at::Tensor scale32 = scale.to(at::kFloat).contiguous();
  const at::Tensor bias32 = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  const int64_t num_tokens = x.size(0), in_features = x.size(1), out_features = weight.size(0);
  at::Tensor out = at::empty({num_tokens, out_features}, x32.options());
  const float* x_ptr = x32.data_ptr<float>();
  const int8_t* w_ptr = weight.data_ptr<int8_t>();
  const float* s_ptr = scale32.data_ptr<float>();
  const float* b_ptr = bias32.defined() ? bias32.data_ptr<float>() : nullptr;
  float* o_ptr = out.data_ptr<float>();
  // Enough rows per thread that waking the pool pays: about 64 KiB of weights.
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(in_features, 1));
  at::parallel_for(0, out_features, grain, [&](int64_t begin, int64_t end) {
    int8_rows(x_ptr, w_ptr, s_ptr, b_ptr, o_ptr, num_tokens, in_features, out_features, begin, end);
  });
  return out.to(x.scalar_type());
}

TORCH_LIBRARY_FRAGMENT(amity, m) {
  m.def("int8_linear(Tensor x, Tensor weight, Tensor scale, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(amity, CPU, m) {
  m.impl("int8_linear", &int8_linear);
}
