// RMSNorm in one pass per row: y = w * (x * 1 / sqrt(mean(x^2) + eps)), float32.
//
// transformers' RMSNorm (Llama, Qwen2, Mistral, Qwen3) runs seven PyTorch operations per call
// (to, pow, mean, add, rsqrt, mul, mul), each a dispatch of a few microseconds on a tensor of
// one to sixteen rows: about 16 us a call on this project's CPU, 1 ms of a 61-norm SmolLM2
// forward, for arithmetic that takes well under one. This kernel does the same arithmetic in one
// call: the mean of squares summed in float64 (every square of a float32 is exact there; one
// rounding to float32 at the end), then the two float32 products in transformers' order (x times
// the reciprocal square root, then the weight times that). Only the mean's rounding can differ
// from PyTorch's float32 sum, by an ulp now and then; a row's result never depends on the rows
// beside it (the order of its sum is fixed), which a tree forward needs to give each node the
// bits a one-token step gives it.

#include <torch/types.h>  // not torch/extension.h: half the parse time; only skinny_gemm.cpp binds to Python
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace {

// Sum of squares of x[0, d) in float64: four (AVX-512: eight) lanes per register, two registers,
// then the lanes added in a fixed order and the tail in sequence.
double sum_of_squares(const float* x, int64_t d) {
  int64_t i = 0;
  double total = 0.0;
#if defined(__AVX512F__)
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  for (; i + 16 <= d; i += 16) {
    const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
    const __m512d hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
    a0 = _mm512_fmadd_pd(lo, lo, a0);
    a1 = _mm512_fmadd_pd(hi, hi, a1);
  }
  total = _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
#elif defined(__AVX2__) && defined(__FMA__)
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  for (; i + 8 <= d; i += 8) {
    const __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
    const __m256d hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    a0 = _mm256_fmadd_pd(lo, lo, a0);
    a1 = _mm256_fmadd_pd(hi, hi, a1);
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(a0, a1));
  total = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
#endif
  for (; i < d; ++i) total += static_cast<double>(x[i]) * x[i];
  return total;
}

void norm_row(const float* x, const float* w, float* y, int64_t d, float eps) {
  const float mean = static_cast<float>(sum_of_squares(x, d) / static_cast<double>(d));
  const float r = 1.0f / std::sqrt(mean + eps);  // PyTorch's rsqrt on the CPU: 1 / sqrt
  for (int64_t i = 0; i < d; ++i) y[i] = w[i] * (x[i] * r);  // vectorized by the compiler; two roundings
}

constexpr int64_t kRowsPerTask = 16;      // rows a thread takes at a time in a prefill
constexpr int64_t kParallelFrom = 65536;  // elements below which one thread does all (no fork)

}  // namespace

// x [..., d] float32, weight [d] float32 -> y [..., d] float32 (x need not be contiguous).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == torch::kFloat32, "rms_norm: x must be float32");
  const int64_t d = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == d && weight.scalar_type() == torch::kFloat32,
              "rms_norm: weight must be float32 [", d, "]");
  const auto rows = x.reshape({-1, d}).contiguous();  // [M, d]
  const auto w = weight.contiguous();
  auto y = torch::empty(x.sizes(), x.options());  // contiguous [..., d]
  const int64_t M = rows.size(0);
  const float* xp = rows.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const float e = static_cast<float>(eps);  // transformers adds eps as a float32 scalar
  auto run = [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) norm_row(xp + m * d, wp, yp + m * d, d, e);
  };
  if (M * d < kParallelFrom) {
    run(0, M);
  } else {
    at::parallel_for(0, M, kRowsPerTask, run);
  }
  return y;
}
