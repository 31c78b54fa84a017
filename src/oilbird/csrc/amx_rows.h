// What the 'int8' kernel (amx_blocks.cpp) computes besides the integer products: each row's inputs
// split into four int8 parts per group (split_rows), and the float32 finish that turns a group's
// exact part sums into the output (finish_group): one code for the tiles and the dot products.
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "block_layouts.h"

namespace oilbird::amx {

constexpr int kParts = 4;                            // int8 parts of x
constexpr int64_t kB = oilbird::blocks::kOutputs;  // outputs per block

// x's rows as the kernels read them (see the top of amx_blocks.cpp).
struct Rows {
  int64_t M, K, G, groups;
  std::vector<int8_t> parts;   // [M][4][K]: a0, a1, a2, a3 of each row (a tile's rows 4 r + s)
  std::vector<int32_t> lead;   // [M][groups]: sum_k a0_k 2^7 + sum_k a1_k (for the centring)
  std::vector<int32_t> trail;  // [M][groups]: sum_k a2_k 2^7 + sum_k a3_k
  std::vector<float> scale;    // [M][groups]: 2^(e - 26), the weight of the combined parts' unit
  std::vector<float> sums;     // [M][groups]: sum of x over the group, in input order
  // The parts start on a cache line (`parts` has 64 bytes of slack): a tile row split over two
  // lines costs two loads, and a vector's allocation is only 16-byte aligned.
  int8_t* at(int s, int64_t r, int64_t g) {
    const auto base = (reinterpret_cast<uintptr_t>(parts.data()) + 63) & ~uintptr_t{63};
    return reinterpret_cast<int8_t*>(base) + (r * kParts + s) * K + g * G;
  }
  const int8_t* part(int s, int64_t r, int64_t g) const { return const_cast<Rows*>(this)->at(s, r, g); }
};

inline Rows split_rows(const float* x, int64_t M, int64_t K, int64_t G) {
  // rows padded with zeros to a multiple of 16: a tile reads four rows' parts at a time, the wide
  // path 16 rows at a time (a padded row's sums are zeros, never stored)
  const int64_t groups = K / G, padded = (M + 15) / 16 * 16, n = padded * groups;
  Rows rows{M, K, G, groups, std::vector<int8_t>(kParts * padded * K + 64), std::vector<int32_t>(n), std::vector<int32_t>(n),
            std::vector<float>(n), std::vector<float>(n)};
  const __m512 step = _mm512_set1_ps(128.0f);
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  // rows in parallel (a forward calls this ~200 times; each row's values are its own)
  at::parallel_for(0, M, 1, [&](int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = x + r * K + g * G;
      const int64_t i = r * groups + g;
      // the group's largest |x| and its sum (a fixed order of additions: the row's own, at any M)
      __m512 most = _mm512_abs_ps(_mm512_loadu_ps(xg)), total = _mm512_loadu_ps(xg);
      for (int64_t k = 16; k < G; k += 16) {
        most = _mm512_max_ps(most, _mm512_abs_ps(_mm512_loadu_ps(xg + k)));
        total = _mm512_add_ps(total, _mm512_loadu_ps(xg + k));
      }
      const float top = _mm512_reduce_max_ps(most);
      rows.sums[i] = _mm512_reduce_add_ps(total);
      const int e = top > 0.0f && std::isfinite(top) ? std::ilogb(top) : 0;  // top in [2^e, 2^(e+1))
      rows.scale[i] = std::ldexp(1.0f, e - 26);  // v = x 2^(5 - e); the parts' unit is 2^-21 of v
      const __m512 shift = _mm512_set1_ps(static_cast<float>(5 - e));
      __m512i count[kParts];
      for (int s = 0; s < kParts; ++s) count[s] = _mm512_setzero_si512();
      for (int64_t k = 0; k < G; k += 16) {
        __m512 t = _mm512_scalef_ps(_mm512_loadu_ps(xg + k), shift);  // v, exact; |v| < 64
        for (int s = 0; s < kParts; ++s) {
          const __m512 a = _mm512_roundscale_ps(t, kNearest);  // in [-64, 64]
          const __m512i ai = _mm512_cvtps_epi32(a);
          count[s] = _mm512_add_epi32(count[s], ai);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(rows.at(s, r, g) + k),
                           _mm512_cvtepi32_epi8(ai));
          t = _mm512_mul_ps(_mm512_sub_ps(t, a), step);  // the rest, exact, in [-64, 64]
        }
      }
      rows.lead[i] = _mm512_reduce_add_epi32(count[0]) * 128 + _mm512_reduce_add_epi32(count[1]);
      rows.trail[i] = _mm512_reduce_add_epi32(count[2]) * 128 + _mm512_reduce_add_epi32(count[3]);
    }
  });
  return rows;
}

// One group's four exact part sums for MT rows (c: [4][MT][16] int32) scaled into the accumulators:
// acc += d 2^(e-26) (((C0 2^7 + C1) - c lead) 2^14 + (C2 2^7 + C3) - c trail) + (m + c d) sum_x.
// The tiles multiply by q - c (kCentred: the c terms are in their sums already), the dot products
// by q (their sums need them): the same integers, then the same code, so the same bits.
template <typename L, int MT, bool kCentred>
inline void finish_group(__m512* acc, const int32_t* c, int64_t stride, int64_t row_stride, const uint8_t* p,
                         const Rows& rows, int64_t m0, int64_t g, int center) {
  __m512 d, m;
  L::scales(p, d, m);
  m = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(center)), d, m);  // the centred offset m + c d
  const __m512 unit = _mm512_set1_ps(16384.0f);
  for (int r = 0; r < MT; ++r) {
    const int64_t i = (m0 + r) * rows.groups + g;
    const auto at = [&](int s) { return _mm512_load_si512(c + s * stride + r * row_stride); };
    __m512i hi = _mm512_add_epi32(_mm512_slli_epi32(at(0), 7), at(1));
    __m512i lo = _mm512_add_epi32(_mm512_slli_epi32(at(2), 7), at(3));
    if constexpr (!kCentred) {
      hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(center * rows.lead[i]));
      lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(center * rows.trail[i]));
    }
    const __m512 t = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), unit, _mm512_cvtepi32_ps(lo));
    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(rows.scale[i])), t, acc[r]);
    acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(rows.sums[i]), acc[r]);
  }
}

template <int MT>
inline void store_rows(const __m512* acc, float* y, int64_t N, int64_t m0, int64_t b, const float* bias) {
  for (int r = 0; r < MT; ++r) {
    __m512 out = acc[r];
    if (bias) out = _mm512_add_ps(out, _mm512_loadu_ps(bias + b * kB));  // after the sum
    _mm512_storeu_ps(y + (m0 + r) * N + b * kB, out);
  }
}

}  // namespace oilbird::amx
