// y = x W^T (+ bias) on the CPU for weights in GGUF's Q4_1 (blocks of 32 inputs;
// per output and block, 4-bit q with a float16 scale d and offset m: w = q d + m),
// computed the way llama.cpp's CPU backend does: each token's activations are
// quantized to int8 per block of 32 (a scale dx, as in Q8_1), a block's dot
// products are exact int32 sums (AVX-512 VNNI: 64 multiply-adds an instruction),
// and each block adds
//     d dx sum_k(q_k qx_k) + m (dx sum_k qx_k)
// to a float32 accumulator. The weights stream at 5 bits each, and one
// instruction does the work of four float32 fmas, so a single stream is bound by
// memory and a prefill by int8 throughput, not by widening weights to floats.
//
// Numbers: a token's int8 activations and block scales depend on that token
// alone, the int32 sums are exact, and the float steps run in one order for every
// token, so a token's outputs are the same bits whatever its batch, tile or thread.
//
// Layout ([N / 32, K / 32, 640] uint8): panels of 32 outputs, each its K / 32
// blocks in order (one stream of bytes). A block is 8 quads of 64 bytes, then
// d[32] and m[32] as float16. In quad g, byte 4i + j holds q of output i (low
// nibble) and of output i + 16 (high nibble) at input 4g + j: the low nibbles are
// VNNI's 16 lanes x 4 inputs for outputs 0-15, the high ones for 16-31.

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define AMITY_Q4_VNNI 1
#endif

namespace amity {
at::Tensor contiguous_as(const at::Tensor& t, at::ScalarType dtype);  // packed_linear.cpp
}
using amity::contiguous_as;

namespace {

constexpr int64_t NR = 32;                              // outputs per panel
constexpr int64_t KB = 32;                              // inputs per block
constexpr int64_t QUAD = 64;                            // bytes per 4 inputs x 32 outputs
constexpr int64_t SCALES = KB / 4 * QUAD;               // 512: d[NR], then m[NR]
constexpr int64_t BLOCK_BYTES = SCALES + 2 * NR * 2;    // 640
constexpr int MR = 8;                                   // tokens per tile: 16 int32 sums in registers
constexpr int64_t AHEAD = 6;                            // blocks prefetched ahead, about 4 KiB

// A token's activations per block of 32: q = round(x * (1 / dx)) (ties to even)
// with dx = max|x| / 127, and s = dx * sum(q) for the offsets' term.
struct Activations {
  const int8_t* q;  // [T, K]
  const float* d;   // [T, K / 32]
  const float* s;   // [T, K / 32]
};

void quantize_block(const float* x, int8_t* q, float& d, float& s) {
#ifdef AMITY_Q4_VNNI
  const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
  d = amax / 127.f;
  const __m512 inverse = _mm512_set1_ps(d != 0.f ? 1.f / d : 0.f);
  // cvtps rounds as MXCSR says: to nearest, ties to even.
  const __m512i q_lo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inverse));
  const __m512i q_hi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inverse));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(q_lo));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(q_hi));
  s = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q_lo, q_hi)));
#else
  float amax = 0.f;
  for (int64_t k = 0; k < KB; ++k) amax = std::max(amax, std::fabs(x[k]));
  d = amax / 127.f;
  const float inverse = d != 0.f ? 1.f / d : 0.f;
  int sum = 0;
  for (int64_t k = 0; k < KB; ++k) {
    const int v = std::clamp(static_cast<int>(std::nearbyint(x[k] * inverse)), -127, 127);
    q[k] = static_cast<int8_t>(v);
    sum += v;
  }
  s = d * static_cast<float>(sum);
#endif
}

// acc[m][0 .. NR) += the panel's outputs for M tokens from m0, every block.
template <int M>
void tile(const uint8_t* panel, int64_t K, const Activations& a, int64_t m0, float* acc) {
  const int64_t num_blocks = K / KB;
#ifdef AMITY_Q4_VNNI
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* block = panel + b * BLOCK_BYTES;
    // Prefetched well ahead: one core's demand misses alone read memory at a
    // fraction of its bandwidth on this kind of machine.
    for (int64_t line = 0; line < BLOCK_BYTES; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(block + AHEAD * BLOCK_BYTES + line), _MM_HINT_T0);
    __m512i sum[M][2];
    for (int m = 0; m < M; ++m) sum[m][0] = sum[m][1] = _mm512_setzero_si512();
    // Straight-line: rolled, gcc moves the sums between registers every quad
    // (1.4-1.7x slower at 128 tokens).
#pragma GCC unroll 8
    for (int64_t g = 0; g < KB / 4; ++g) {
      const __m512i v = _mm512_loadu_si512(block + g * QUAD);
      const __m512i lo = _mm512_and_si512(v, low4);
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      for (int m = 0; m < M; ++m) {
        int32_t four;
        std::memcpy(&four, a.q + (m0 + m) * K + b * KB + g * 4, 4);
        const __m512i xq = _mm512_set1_epi32(four);
        sum[m][0] = _mm512_dpbusd_epi32(sum[m][0], lo, xq);
        sum[m][1] = _mm512_dpbusd_epi32(sum[m][1], hi, xq);
      }
    }
    const __m256i* scales = reinterpret_cast<const __m256i*>(block + SCALES);
    const __m512 d[2] = {_mm512_cvtph_ps(_mm256_loadu_si256(scales)), _mm512_cvtph_ps(_mm256_loadu_si256(scales + 1))};
    const __m512 off[2] = {_mm512_cvtph_ps(_mm256_loadu_si256(scales + 2)),
                           _mm512_cvtph_ps(_mm256_loadu_si256(scales + 3))};
    for (int m = 0; m < M; ++m) {
      const int64_t row = (m0 + m) * num_blocks + b;
      const __m512 dx = _mm512_set1_ps(a.d[row]), sx = _mm512_set1_ps(a.s[row]);
      for (int h = 0; h < 2; ++h) {
        float* c = acc + m * NR + h * 16;
        __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[m][h]), _mm512_mul_ps(d[h], dx), _mm512_loadu_ps(c));
        _mm512_storeu_ps(c, _mm512_fmadd_ps(off[h], sx, v));
      }
    }
  }
#else
  // Other CPUs: the same integer sums and float steps, one output at a time.
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* block = panel + b * BLOCK_BYTES;
    const c10::Half* scales = reinterpret_cast<const c10::Half*>(block + SCALES);
    for (int m = 0; m < M; ++m) {
      const int8_t* xq = a.q + (m0 + m) * K + b * KB;
      const int64_t row = (m0 + m) * num_blocks + b;
      for (int64_t n = 0; n < NR; ++n) {
        int sum = 0;
        for (int64_t k = 0; k < KB; ++k) {
          const uint8_t byte = block[k / 4 * QUAD + (n % 16) * 4 + k % 4];
          sum += (n < 16 ? byte & 15 : byte >> 4) * xq[k];
        }
        float& c = acc[m * NR + n];
        c = std::fma(static_cast<float>(sum), static_cast<float>(scales[n]) * a.d[row], c);
        c = std::fma(static_cast<float>(scales[NR + n]), a.s[row], c);
      }
    }
  }
#endif
}

struct Problem {
  Activations a;
  const uint8_t* weight;
  const float* bias;  // [N] or null
  float* out;         // [T, N]
  int64_t T, K, N;
};

void run_panel(const Problem& pb, int64_t panel) {
  const uint8_t* w = pb.weight + panel * (pb.K / KB) * BLOCK_BYTES;
  alignas(64) float acc[MR * NR];
  for (int64_t m0 = 0; m0 < pb.T; m0 += MR) {
    const int64_t count = std::min<int64_t>(MR, pb.T - m0);
    std::fill(acc, acc + count * NR, 0.f);
    switch (count) {
#define AMITY_TILE(M) case M: tile<M>(w, pb.K, pb.a, m0, acc); break;
      AMITY_TILE(1) AMITY_TILE(2) AMITY_TILE(3) AMITY_TILE(4) AMITY_TILE(5) AMITY_TILE(6)
      AMITY_TILE(7) AMITY_TILE(8)
#undef AMITY_TILE
      default: break;
    }
    for (int64_t m = 0; m < count; ++m) {
      float* out = pb.out + (m0 + m) * pb.N + panel * NR;
      for (int64_t j = 0; j < NR; ++j) out[j] = acc[m * NR + j] + (pb.bias ? pb.bias[panel * NR + j] : 0.f);
    }
  }
}

}  // namespace

// x [T, K] float32 or bfloat16, K a multiple of 32; weight [N / 32, K / 32, 640]
// uint8 as above; bias [N] or undefined. Returns [T, N] in x's dtype.
at::Tensor q4_1_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2, "amity::q4_1_linear takes a 2-D CPU input");
  TORCH_CHECK(weight.scalar_type() == at::kByte && weight.dim() == 3 && weight.size(2) == BLOCK_BYTES &&
                  weight.is_contiguous(),
              "amity::q4_1_linear: weight must be contiguous uint8 [N / 32, K / 32, 640]");
  TORCH_CHECK(weight.size(1) * KB == x.size(1), "weight and input disagree on in_features");
  const int64_t T = x.size(0), K = x.size(1), N = weight.size(0) * NR;
  const at::Tensor x32 = contiguous_as(x, at::kFloat);
  const at::Tensor bias32 = bias.has_value() ? contiguous_as(*bias, at::kFloat) : at::Tensor();
  at::Tensor x_q = at::empty({T, K}, x.options().dtype(at::kChar));
  at::Tensor x_scales = at::empty({2, T, K / KB}, x32.options());
  at::Tensor out = at::empty({T, N}, x32.options());
  const float* xp = x32.data_ptr<float>();
  int8_t* qp = x_q.data_ptr<int8_t>();
  float* dp = x_scales.data_ptr<float>();
  float* sp = dp + T * (K / KB);
  for (int64_t i = 0; i < T * (K / KB); ++i) quantize_block(xp + i * KB, qp + i * KB, dp[i], sp[i]);
  const Problem pb{{qp, dp, sp}, weight.data_ptr<uint8_t>(), bias32.defined() ? bias32.data_ptr<float>() : nullptr,
                   out.data_ptr<float>(), T, K, N};
  // Tasks of a few panels, handed out one at a time: a thread that loses its core
  // to the server's event loop leaves its panels to the other thread.
  const int64_t num_panels = N / NR;
  const int64_t panels_per_task = T <= MR ? 4 : 1;
  const int64_t num_tasks = (num_panels + panels_per_task - 1) / panels_per_task;
  const bool parallel = T > 0 && weight.numel() >= (128 << 10);  // waking a thread pays past ~64 KiB each
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int64_t task = 0; task < num_tasks; ++task)
    for (int64_t panel = task * panels_per_task; panel < std::min(num_panels, (task + 1) * panels_per_task); ++panel)
      run_panel(pb, panel);
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

TORCH_LIBRARY_FRAGMENT(amity, m) {
  m.def("q4_1_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
}

TORCH_LIBRARY_IMPL(amity, CPU, m) {
  m.impl("q4_1_linear", &q4_1_linear);
}
