// The greedy token of each row of float32 logits: torch.argmax(x, dim=1)'s answer
// (the first index of the row's largest value; a row with a NaN gives its first
// NaN), in two vector passes over the row: its largest value, then where that value
// first stands. ATen's argmax compares one (value, index) pair at a time, several
// times slower on a decode step's logits (benchmarks/README.md).

#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

int64_t row_argmax(const float* x, int64_t n) {
  int64_t i = 0;
  float top = -std::numeric_limits<float>::infinity();
  bool nan = false;
#if defined(__AVX512F__)
  __m512 top16 = _mm512_set1_ps(top);
  __mmask16 unordered = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    top16 = _mm512_max_ps(top16, v);
  }
  nan = unordered != 0;
  top = _mm512_reduce_max_ps(top16);
#endif
  for (; i < n; ++i) {
    nan |= std::isnan(x[i]);
    top = x[i] > top ? x[i] : top;
  }
  if (nan) {
    for (int64_t j = 0; j < n; ++j)
      if (std::isnan(x[j])) return j;
  }
  // -0.0 and 0.0 compare equal, as in argmax's own comparisons.
  i = 0;
#if defined(__AVX512F__)
  const __m512 wanted = _mm512_set1_ps(top);
  for (; i + 16 <= n; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), wanted, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
#endif
  for (; i < n; ++i)
    if (x[i] == top) return i;
  return 0;  // not reached: `top` is one of the row's values (-inf for a row of -inf)
}

at::Tensor argmax_rows(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kFloat && x.size(1) > 0,
              "amity::argmax_rows takes non-empty rows of 2-D float32 CPU logits");
  const at::Tensor rows = x.contiguous();
  const int64_t B = rows.size(0), V = rows.size(1);
  at::Tensor out = at::empty({B}, rows.options().dtype(at::kLong));
  const float* xp = rows.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
#pragma omp parallel for schedule(static) if (B * V >= 65536)
  for (int64_t b = 0; b < B; ++b) op[b] = row_argmax(xp + b * V, V);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(amity, m) {
  m.def("argmax_rows(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(amity, CPU, m) {
  m.impl("argmax_rows", &argmax_rows);
}
