// The few vector operations our kernels use, for AVX-512 or AVX2 + FMA: whichever the module is
// compiled for (oilbird/skinny_gemm.py picks the flags from the CPU it runs on). The kernels are
// written once against these names; the ISA sets the vector width (kLanes floats) and how many
// registers a kernel may fill with accumulators before the compiler spills (kAccumulators).
#pragma once

#include <immintrin.h>

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <limits>

namespace oilbird::simd {

#if defined(__AVX512F__)

constexpr int kLanes = 16;         // floats per register
constexpr int kRegisters = 32;
constexpr int kAccumulators = 28;  // of 32 registers; the rest hold loads and broadcasts
using vf = __m512;

inline vf zero() { return _mm512_setzero_ps(); }
inline vf load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf set1(float x) { return _mm512_set1_ps(x); }
inline vf fmadd(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
inline vf fnmadd(vf a, vf b, vf c) { return _mm512_fnmadd_ps(a, b, c); }
inline vf add(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf div(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf max(vf a, vf b) { return _mm512_max_ps(a, b); }
inline float reduce_max(vf v) { return _mm512_reduce_max_ps(v); }
inline float reduce_add(vf v) { return _mm512_reduce_add_ps(v); }
inline vf round(vf v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vf zero_where_less(vf v, vf x, vf lo) {  // lanes where x < lo become 0
  return _mm512_maskz_mov_ps(~_mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ), v);
}
inline uint32_t greater_bits(vf a, vf b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
inline vf load(const c10::BFloat16* p) {  // bfloat16 is the top half of a float32
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline vf pow2(vf k) {  // 2^k for integral k in [-126, 127]
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23));
}

#elif defined(__AVX2__) && defined(__FMA__)

constexpr int kLanes = 8;
constexpr int kRegisters = 16;
constexpr int kAccumulators = 12;  // of 16 registers
using vf = __m256;

inline vf zero() { return _mm256_setzero_ps(); }
inline vf load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf set1(float x) { return _mm256_set1_ps(x); }
inline vf fmadd(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf fnmadd(vf a, vf b, vf c) { return _mm256_fnmadd_ps(a, b, c); }
inline vf add(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf sub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf mul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf div(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf max(vf a, vf b) { return _mm256_max_ps(a, b); }
inline float reduce_max(vf v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}
inline float reduce_add(vf v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline vf round(vf v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline vf zero_where_less(vf v, vf x, vf lo) { return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), v); }
inline uint32_t greater_bits(vf a, vf b) { return _mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ)); }
inline vf load(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline vf pow2(vf k) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23));
}

#else
#error "oilbird's kernels need AVX-512 or AVX2 with FMA (compile with -mavx512f or -mavx2 -mfma)"
#endif

// n < kLanes floats from p, the other lanes `fill`: a row's last partial block without reading past it.
inline vf load_partial(const float* p, int64_t n, float fill) {
  alignas(64) float buf[kLanes];
  for (int i = 0; i < kLanes; ++i) buf[i] = i < n ? p[i] : fill;
  return load(buf);
}

// e^x per lane: x = k ln2 + r, |r| <= ln2/2, e^r by Taylor to degree 7, times 2^k (relative error
// ~1e-7); below -87 (e^x < 2^-125) the result is 0.
inline vf exp(vf x) {
  const vf lo = set1(-87.0f);
  const vf xc = max(x, lo);
  const vf k = round(mul(xc, set1(1.44269504088896341f)));
  vf r = fnmadd(k, set1(0.693359375f), xc);  // Cody-Waite: ln2 in two parts
  r = fnmadd(k, set1(-2.12194440e-4f), r);
  vf p = set1(1.0f / 5040);
  p = fmadd(p, r, set1(1.0f / 720));
  p = fmadd(p, r, set1(1.0f / 120));
  p = fmadd(p, r, set1(1.0f / 24));
  p = fmadd(p, r, set1(1.0f / 6));
  p = fmadd(p, r, set1(0.5f));
  p = fmadd(p, r, set1(1.0f));
  p = fmadd(p, r, set1(1.0f));
  return zero_where_less(mul(p, pow2(k)), x, lo);
}

}  // namespace oilbird::simd
