// How the 'int8' kernel (amx_blocks.cpp) reads one group of a block layout (block_layouts.h):
// its q as quads, row kq = for each of the 16 outputs the 4 unsigned bytes q[4 kq .. 4 kq + 3],
// 64 bytes a row, kInputs / 4 rows: the right operand of an AMX int8 tile multiply and of VNNI
// dot products alike. Needs AVX512-VBMI (byte permutes, multishift) and BMI2 (pdep).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "block_layouts.h"

namespace oilbird::blocks {

// One group's q as quads: row kq = for each output j the 4 bytes q_j[4 kq .. 4 kq + 3] minus `offset`
// (bytewise: 0 leaves q unsigned for the dot products, the centre c makes q - c signed for the
// tiles), 64 bytes, kInputs / 4 rows.
template <typename L>
struct Quads;

// Nibbles: quad kq is input pairs 2 kq and 2 kq + 1 (32 bytes; byte j of a pair = output j's even
// input in the low nibble, the odd one in the high). A byte permute puts output j's two bytes
// twice into its dword, a multishift picks the four nibbles out, an AND clears the rest.
inline __m512i nibble_quad(const uint8_t* pairs) {
  const __m512i src = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs)));
  alignas(64) static const uint8_t index[64] = {
      0, 0, 16, 16, 1, 1, 17, 17, 2, 2, 18, 18, 3, 3, 19, 19, 4, 4, 20, 20, 5, 5, 21, 21, 6, 6, 22, 22, 7, 7, 23, 23,
      8, 8, 24, 24, 9, 9, 25, 25, 10, 10, 26, 26, 11, 11, 27, 27, 12, 12, 28, 28, 13, 13, 29, 29, 14, 14, 30, 30, 15, 15, 31, 31};
  // bit offsets in each qword: low nibble of byte 0, high of byte 1, low of byte 2, high of byte 3, per dword
  const __m512i shifts = _mm512_set1_epi64(0x3C302C201C100C00LL);
  const __m512i spread = _mm512_permutexvar_epi8(_mm512_load_si512(index), src);
  return _mm512_and_si512(_mm512_multishift_epi64_epi8(shifts, spread), _mm512_set1_epi8(0x0F));
}

template <>
struct Quads<Nibbles> {
  static void rows(const uint8_t* group, uint8_t* out, __m512i offset) {
    for (int64_t kq = 0; kq < 8; ++kq)
      _mm512_store_si512(out + kq * 64, _mm512_sub_epi8(nibble_quad(group + 64 + kq * 32), offset));
  }
};

// FiveBits: the nibbles, then each input's fifth bit (a 32-bit word per pair: bit j the even input
// of output j, bit 16 + j the odd one) deposited into a byte mask that ORs in 16.
template <>
struct Quads<FiveBits> {
  static void rows(const uint8_t* group, uint8_t* out, __m512i offset) {
    const __m512i sixteen = _mm512_set1_epi8(16);
    for (int64_t kq = 0; kq < 8; ++kq) {
      uint32_t w0, w1;
      std::memcpy(&w0, group + Nibbles::kBytes + (2 * kq) * 4, 4);
      std::memcpy(&w1, group + Nibbles::kBytes + (2 * kq + 1) * 4, 4);
      const uint64_t mask = _pdep_u64(w0 & 0xFFFF, 0x1111111111111111ULL) | _pdep_u64(w0 >> 16, 0x2222222222222222ULL) |
                            _pdep_u64(w1 & 0xFFFF, 0x4444444444444444ULL) | _pdep_u64(w1 >> 16, 0x8888888888888888ULL);
      const __m512i quad = nibble_quad(group + 64 + kq * 32);
      _mm512_store_si512(out + kq * 64, _mm512_sub_epi8(_mm512_mask_blend_epi8(mask, quad, _mm512_or_si512(quad, sixteen)), offset));
    }
  }
};

// Bytes: input i is 16 bytes (output j's q at byte j): a quad is 64 contiguous bytes, one permute.
template <>
struct Quads<Bytes> {
  static void rows(const uint8_t* group, uint8_t* out, __m512i offset) {
    alignas(64) static const uint8_t index[64] = {
        0, 16, 32, 48, 1, 17, 33, 49, 2, 18, 34, 50, 3, 19, 35, 51, 4, 20, 36, 52, 5, 21, 37, 53, 6, 22, 38, 54, 7, 23, 39, 55,
        8, 24, 40, 56, 9, 25, 41, 57, 10, 26, 42, 58, 11, 27, 43, 59, 12, 28, 44, 60, 13, 29, 45, 61, 14, 30, 46, 62, 15, 31, 47, 63};
    const __m512i perm = _mm512_load_si512(index);
    for (int64_t kq = 0; kq < 4; ++kq)
      _mm512_store_si512(out + kq * 64, _mm512_sub_epi8(_mm512_permutexvar_epi8(perm, _mm512_loadu_si512(group + 128 + kq * 64)), offset));
  }
};

}  // namespace oilbird::blocks
