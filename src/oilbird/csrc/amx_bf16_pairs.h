// How the 'bf16' kernel (amx_bf16_blocks.cpp) reads one group of a block layout (block_layouts.h):
// as the right operand of an AMX bfloat16 tile multiply (TDPBF16PS), row p = for each of the 16
// outputs the dword bf16(q[2p] - c) | bf16(q[2p + 1] - c) << 16 (G/2 rows of 64 bytes), then the
// group's d[16] and m + c d [16] in float32 (`make_group`). q - c is a small integer, so its
// bfloat16 is exact. Needs AVX-512 (BW for the byte loads); the tables are looked up with vpermd.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "block_layouts.h"

namespace oilbird::blocks {

// One group of one block in the form the multiplies read: G/2 pair rows of 64 bytes, d, m + c d.
constexpr int64_t made_bytes(int64_t G) { return G / 2 * 64 + 128; }

// The bfloat16 bits of the integer v (|v| <= 256: exact).
inline uint32_t bf16_bits(int v) {
  const float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u >> 16;
}

// A group's B tile: row p = for each output j the dword bf16(q_j[2p] - c) | bf16(q_j[2p + 1] - c) << 16.
template <typename L>
struct PairRows;

template <>
struct PairRows<Nibbles> {
  __m512i lo, hi;  // bf16(i - c) and bf16(i - c) << 16 for i = 0..15
  explicit PairRows(int center) {
    alignas(64) uint32_t t[16];
    for (int i = 0; i < 16; ++i) t[i] = bf16_bits(i - center);
    lo = _mm512_load_si512(t);
    hi = _mm512_slli_epi32(lo, 16);
  }
  // The byte of pair p for output j is even | odd << 4; vpermd reads only an index's low 4 bits.
  void rows(const uint8_t* group, uint8_t* out) const {
    for (int64_t p = 0; p < 16; ++p) {
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 64 + p * 16)));
      const __m512i even = _mm512_permutexvar_epi32(v, lo), odd = _mm512_permutexvar_epi32(_mm512_srli_epi32(v, 4), hi);
      _mm512_store_si512(out + p * 64, _mm512_or_si512(even, odd));
    }
  }
};

template <>
struct PairRows<FiveBits> {
  __m512i lo[2], hi[2];  // bf16(i - c) for i = 0..31 (two tables of 16), and << 16
  explicit PairRows(int center) {
    alignas(64) uint32_t t[32];
    for (int i = 0; i < 32; ++i) t[i] = bf16_bits(i - center);
    for (int h = 0; h < 2; ++h) lo[h] = _mm512_load_si512(t + 16 * h), hi[h] = _mm512_slli_epi32(lo[h], 16);
  }
  // The nibbles as above, each input's fifth bit from the pair's word (bit j even, 16 + j odd)
  // setting the index's bit 4, which picks the second table.
  void rows(const uint8_t* group, uint8_t* out) const {
    const __m512i nibble = _mm512_set1_epi32(0x0F), sixteen = _mm512_set1_epi32(16);
    for (int64_t p = 0; p < 16; ++p) {
      const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(group + 64 + p * 16)));
      uint16_t even_bits, odd_bits;
      std::memcpy(&even_bits, group + Nibbles::kBytes + p * 4, 2);
      std::memcpy(&odd_bits, group + Nibbles::kBytes + p * 4 + 2, 2);
      const __m512i e = _mm512_and_si512(v, nibble), o = _mm512_srli_epi32(v, 4);
      const __m512i ei = _mm512_mask_or_epi32(e, static_cast<__mmask16>(even_bits), e, sixteen);
      const __m512i oi = _mm512_mask_or_epi32(o, static_cast<__mmask16>(odd_bits), o, sixteen);
      const __m512i even = _mm512_permutex2var_epi32(lo[0], ei, lo[1]);
      const __m512i odd = _mm512_permutex2var_epi32(hi[0], oi, hi[1]);
      _mm512_store_si512(out + p * 64, _mm512_or_si512(even, odd));
    }
  }
};

template <>
struct PairRows<Bytes> {
  __m512i c;
  explicit PairRows(int center) : c(_mm512_set1_epi32(center)) {}
  // q - c (-128..255) converted to float32, whose upper half is its bfloat16 (exact: 8 bits).
  void rows(const uint8_t* group, uint8_t* out) const {
    const __m512i upper = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (int64_t p = 0; p < 8; ++p) {
      const uint8_t* q = group + 128 + p * 32;
      const __m512i e = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))), c);
      const __m512i o = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16))), c);
      const __m512i ef = _mm512_srli_epi32(_mm512_castps_si512(_mm512_cvtepi32_ps(e)), 16);
      const __m512i of = _mm512_castps_si512(_mm512_cvtepi32_ps(o));
      _mm512_store_si512(out + p * 64, _mm512_ternarylogic_epi32(ef, of, upper, 0xF8));  // ef | (of & upper)
    }
  }
};

// A group of layout L made into the form above at `out` (64-byte aligned).
template <typename L>
inline void make_group(const PairRows<L>& pairs, const uint8_t* group, uint8_t* out, int center) {
  constexpr int64_t kTile = L::kInputs / 2 * 64;
  pairs.rows(group, out);
  __m512 d, m;
  L::scales(group, d, m);
  _mm512_store_ps(reinterpret_cast<float*>(out + kTile), d);
  _mm512_store_ps(reinterpret_cast<float*>(out + kTile) + 16,
                  _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(center)), d, m));
}

}  // namespace oilbird::blocks
