// A measurement probe, not a kernel of the package (scripts/q4_1_probe.py builds and times it):
// a few-row GEMM on weights held as the default model's GGUF holds them, Q4_1 (llama.cpp's
// 4-bit blocks: per 32 inputs of an output, w = d * q + m with d and m float16, q in 0..15).
// Each weight is rebuilt in registers as fma(d, q, m) in float32, which is exactly the float32
// value transformers' GGUF loader computes ((d * q) + m in numpy: d * q is exact, one rounding),
// and multiplied in the fp32 skinny kernel's order (sequential over k), so the output is
// bit-identical to that kernel's on the dequantized weights while the memory stream is 0.75
// bytes a weight instead of 4. AVX-512 only; rows 1, 2, 4, 8, 12, 16.
//
// Layout per block of 16 outputs and group of 32 inputs (384 bytes): d[16] and m[16] float32,
// then 16 pairs of inputs, 16 bytes each (byte j: output j's even input in the low nibble, its
// odd input in the high one).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <algorithm>

constexpr int64_t kB = 16;          // outputs per block
constexpr int64_t kG = 32;          // inputs per Q4_1 group
constexpr int64_t kGroupBytes = 64 + 64 + 256;  // d[16] f32, m[16] f32, 16 pairs x 16 bytes

// q [N, K] uint8 (0..15), d, m [N, K/32] float32 -> [N/16, K/32, 384] bytes
torch::Tensor pack_q4(const torch::Tensor& q, const torch::Tensor& d, const torch::Tensor& m) {
  const int64_t N = q.size(0), K = q.size(1);
  TORCH_CHECK(N % kB == 0 && K % kG == 0, "pack_q4: N % 16, K % 32");
  auto out = torch::empty({N / kB, K / kG, kGroupBytes}, q.options().dtype(torch::kUInt8));
  auto qa = q.accessor<uint8_t, 2>(); auto da = d.accessor<float, 2>(); auto ma = m.accessor<float, 2>();
  uint8_t* o = out.data_ptr<uint8_t>();
  for (int64_t b = 0; b < N / kB; ++b)
    for (int64_t g = 0; g < K / kG; ++g) {
      uint8_t* p = o + (b * (K / kG) + g) * kGroupBytes;
      float* dp = reinterpret_cast<float*>(p); float* mp = dp + kB;
      for (int j = 0; j < kB; ++j) { dp[j] = da[b * kB + j][g]; mp[j] = ma[b * kB + j][g]; }
      uint8_t* qp = p + 128;
      for (int kk = 0; kk < kG / 2; ++kk)
        for (int j = 0; j < kB; ++j)
          qp[kk * kB + j] = qa[b * kB + j][g * kG + 2 * kk] | (qa[b * kB + j][g * kG + 2 * kk + 1] << 4);
    }
  return out;
}

template <int M, int NB>
void block(const float* x, const uint8_t* wp, float* y, int64_t K, int64_t N, int64_t nb0) {
  __m512 acc[M][NB];
  for (int r = 0; r < M; ++r) for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_ps();
  const int64_t groups = K / kG;
  const uint8_t* w[NB];
  for (int b = 0; b < NB; ++b) w[b] = wp + (nb0 + b) * groups * kGroupBytes;
  const __m128i low = _mm_set1_epi8(0x0F);
  for (int64_t g = 0; g < groups; ++g) {
    __m512 dv[NB], mv[NB];
    for (int b = 0; b < NB; ++b) {
      const uint8_t* p = w[b] + g * kGroupBytes;
      for (int l = 0; l < 6; ++l) {
        _mm_prefetch(reinterpret_cast<const char*>(p + 16 * kGroupBytes + l * 64), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(p + 3 * kGroupBytes + l * 64), _MM_HINT_T0);
      }
      dv[b] = _mm512_loadu_ps(reinterpret_cast<const float*>(p));
      mv[b] = _mm512_loadu_ps(reinterpret_cast<const float*>(p) + kB);
    }
    for (int kk = 0; kk < kG / 2; ++kk) {
      __m512 w0[NB], w1[NB];
      for (int b = 0; b < NB; ++b) {
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[b] + g * kGroupBytes + 128 + kk * kB));
        const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, low)));
        const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), low)));
        w0[b] = _mm512_fmadd_ps(dv[b], lo, mv[b]);
        w1[b] = _mm512_fmadd_ps(dv[b], hi, mv[b]);
      }
      const int64_t k = g * kG + 2 * kk;
      for (int r = 0; r < M; ++r) {
        const __m512 x0 = _mm512_set1_ps(x[r * K + k]);
        for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_fmadd_ps(x0, w0[b], acc[r][b]);
      }
      for (int r = 0; r < M; ++r) {
        const __m512 x1 = _mm512_set1_ps(x[r * K + k + 1]);
        for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_fmadd_ps(x1, w1[b], acc[r][b]);
      }
    }
  }
  for (int r = 0; r < M; ++r)
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(y + r * N + (nb0 + b) * kB, acc[r][b]);
}

template <int M, int NB>
void rows(const float* x, const uint8_t* wp, float* y, int64_t K, int64_t N) {
  const int64_t blocks = N / kB, groups = blocks / NB;
  at::parallel_for(0, groups, 8, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) block<M, NB>(x, wp, y, K, N, g * NB);
  });
  for (int64_t nb = groups * NB; nb < blocks; ++nb) block<M, 1>(x, wp, y, K, N, nb);
}

torch::Tensor linear_q4(const torch::Tensor& x, const torch::Tensor& packed) {
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * kB;
  TORCH_CHECK(packed.size(1) * kG == K);
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>(); const uint8_t* wp = packed.data_ptr<uint8_t>(); float* yp = y.data_ptr<float>();
  switch (M) {
    case 1: rows<1, 4>(xp, wp, yp, K, N); break;
    case 2: rows<2, 4>(xp, wp, yp, K, N); break;
    case 4: rows<4, 4>(xp, wp, yp, K, N); break;
    case 8: rows<8, 2>(xp, wp, yp, K, N); break;
    case 12: rows<12, 1>(xp, wp, yp, K, N); break;
    case 16: rows<16, 1>(xp, wp, yp, K, N); break;
    default: TORCH_CHECK(false, "prototype: M in 1,2,4,8,12,16");
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack_q4", &pack_q4);
  m.def("linear_q4", &linear_q4);
}
