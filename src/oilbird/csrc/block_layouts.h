// How our GEMM over GGUF blocks (q4_gemm.cpp) stores one group of 16 outputs x G inputs, and how
// it rebuilds their float32 weights in registers: w = fma(d, q, m), per output a scale d and an
// offset m shared by the group's inputs, q a small unsigned integer per weight.
//
// Every GGUF type whose loader makes a weight as one rounding of d' * q' + m' (d', m' exact in
// float32, q' an integer) fits: fma(d, q, m) rounds the same exact number once. Q4_1: q 0..15,
// d and m float16. Q5_0: d * (q - 16) with q 0..31, m = -16 d (exact). Q4_K: fl(fl(D q) - M) with
// D = d sc, M = dmin mn exact float32 and D q exact (17 + 4 bits), per 32 inputs. Q6_K: D (q - 32),
// q 0..63, D = d sc (18 bits), whose product with q - 32 is exact (23 bits), m = -32 D, per 16
// inputs. Q8_0: d q with q -128..127, stored as q + 128 with m = -128 d. The layouts:
//
// - Nibbles (Q4_1; G = 32; 320 bytes): d[16] float16, m[16] float16, then 16 input pairs of 16
//   bytes (byte j: output j's even input in the low nibble, its odd input in the high one).
// - FiveBits (Q5_0; G = 32; 384 bytes): Nibbles, then per input pair a 32-bit word: bit j the even
//   input's fifth bit of output j, bit 16 + j the odd one's, read into mask registers (an OR of
//   16 under the mask: no shuffles).
// - Bytes (the K-quants, Q8_0; G = 16; 384 bytes): d[16] float32, m[16] float32, then 16 inputs of
//   16 bytes (byte j: output j's q), 1.5 bytes a weight.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace oilbird::blocks {

constexpr int64_t kOutputs = 16;  // outputs per block: one 16-lane register

#if defined(__AVX512F__)

struct Nibbles {
  static constexpr int64_t kInputs = 32, kBytes = 320;
  static void scales(const uint8_t* group, __m512& d, __m512& m) {
    d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group)));  // exact widening
    m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(group + 32)));
  }
  // q of input pair kk's even (lo) and odd (hi) input for the 16 outputs, in 32-bit lanes.
  static void pair(const uint8_t* group, int64_t kk, __m512i& lo, __m512i& hi) {
    const __m512i raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 64 + kk * 16)));
    lo = _mm512_and_si512(raw, _mm512_set1_epi32(0x0F));
    hi = _mm512_srli_epi32(raw, 4);
  }
};

struct FiveBits {
  static constexpr int64_t kInputs = 32, kBytes = 384;
  static void scales(const uint8_t* group, __m512& d, __m512& m) { Nibbles::scales(group, d, m); }
  static void pair(const uint8_t* group, int64_t kk, __m512i& lo, __m512i& hi) {
    Nibbles::pair(group, kk, lo, hi);
    uint16_t even, odd;  // (memcpy: an unaligned load the compiler turns into a mask load)
    std::memcpy(&even, group + Nibbles::kBytes + kk * 4, 2);
    std::memcpy(&odd, group + Nibbles::kBytes + kk * 4 + 2, 2);
    const __m512i sixteen = _mm512_set1_epi32(16);
    lo = _mm512_mask_or_epi32(lo, static_cast<__mmask16>(even), lo, sixteen);
    hi = _mm512_mask_or_epi32(hi, static_cast<__mmask16>(odd), hi, sixteen);
  }
};

struct Bytes {
  static constexpr int64_t kInputs = 16, kBytes = 384;
  static void scales(const uint8_t* group, __m512& d, __m512& m) {
    d = _mm512_loadu_ps(reinterpret_cast<const float*>(group));
    m = _mm512_loadu_ps(reinterpret_cast<const float*>(group + 64));
  }
  static void pair(const uint8_t* group, int64_t kk, __m512i& lo, __m512i& hi) {
    const uint8_t* q = group + 128 + kk * 32;
    lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    hi = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)));
  }
};

#endif

}  // namespace oilbird::blocks
