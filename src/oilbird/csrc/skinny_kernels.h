// Few-row fp32 GEMM kernels (AVX-512 or AVX2, see simd.h): y[M, N] = x[M, K] @ W[N, K]^T (+ bias)
// from W packed as [N/16][K][16]. See skinny_gemm.cpp for why and how.
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "simd.h"

namespace oilbird {

namespace v = simd;
constexpr int64_t kBlock = 16;                // outputs per packed block (one 64-byte line per k)
constexpr int kPer = kBlock / v::kLanes;      // registers per block: 1 (AVX-512) or 2 (AVX2)
// Rows that one pass over the weights serves without spilling accumulators: 12 or 6.
constexpr int kShortRows = std::min(12, v::kAccumulators / kPer);
// Blocks per tile of kShortRows rows in the tall kernel: 2 (24 accumulators) or 1 (12).
constexpr int kTallBlocks = std::max(1, v::kAccumulators / (kShortRows * kPer));

// M rows by NB blocks of 16 outputs starting at block nb0, over all K. `ahead`, when given, is
// `ahead_lines` 64-byte lines of weights that a later call will read: they are prefetched evenly
// over the K steps, so the memory stream keeps going while this call reads its own from cache.
template <int M, int NB>
void block(const float* x, const float* wp, float* y, int64_t K, int64_t N, int64_t nb0,
           const float* bias, const float* ahead = nullptr, int64_t ahead_lines = 0) {
  v::vf acc[M][NB * kPer];
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB * kPer; ++b) acc[m][b] = v::zero();
  const float* w[NB];
  for (int b = 0; b < NB; ++b) w[b] = wp + (nb0 + b) * K * kBlock;
  int64_t credit = 0;  // ahead_lines per K steps: a line each time the credit passes K
  for (int64_t k = 0; k < K; ++k) {
    for (credit += ahead_lines; credit >= K; credit -= K, ahead += kBlock)
      _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T1);
    v::vf wv[NB * kPer];
    for (int b = 0; b < NB; ++b) {
      // 32 lines (2 KiB) ahead: the stream stays ahead of the FMAs.
      _mm_prefetch(reinterpret_cast<const char*>(w[b] + (k + 32) * kBlock), _MM_HINT_T0);
      for (int h = 0; h < kPer; ++h) wv[b * kPer + h] = v::load(w[b] + k * kBlock + h * v::kLanes);
    }
    for (int m = 0; m < M; ++m) {
      const v::vf xv = v::set1(x[m * K + k]);
      for (int b = 0; b < NB * kPer; ++b) acc[m][b] = v::fmadd(xv, wv[b], acc[m][b]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB * kPer; ++b) {
      v::vf r = acc[m][b];
      const int64_t col = nb0 * kBlock + b * v::kLanes;
      if (bias) r = v::add(r, v::load(bias + col));
      v::store(y + m * N + col, r);
    }
}

// Up to kShortRows rows: one pass over the weights, NB blocks at a time (NB x M registers of
// accumulators within the budget, so a row count's registers never spill), the blocks split
// across threads.
template <int M>
void short_rows(const float* x, const float* wp, float* y, int64_t K, int64_t N, const float* bias) {
  constexpr int NB = std::max(1, std::min(4, v::kAccumulators / (M * kPer)));
  const int64_t blocks = N / kBlock, groups = blocks / NB;
  at::parallel_for(0, groups, 8, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) block<M, NB>(x, wp, y, K, N, g * NB, bias);
  });
  for (int64_t nb = groups * NB; nb < blocks; ++nb) block<M, 1>(x, wp, y, K, N, nb, bias);
}

using ShortFn = void (*)(const float*, const float*, float*, int64_t, int64_t, const float*);
constexpr ShortFn kShort[13] = {nullptr, short_rows<1>, short_rows<2>, short_rows<3>, short_rows<4>,
                                short_rows<5>, short_rows<6>, short_rows<7>, short_rows<8>,
                                short_rows<9>, short_rows<10>, short_rows<11>, short_rows<12>};

using TileFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, const float*,
                        const float*, int64_t);
template <int M, int NB>
void tile(const float* x, const float* wp, float* y, int64_t K, int64_t N, int64_t nb, const float* b,
          const float* ahead, int64_t ahead_lines) {
  block<M, NB>(x, wp, y, K, N, nb, b, ahead, ahead_lines);
}
constexpr TileFn kGroup[13] = {nullptr, tile<1, kTallBlocks>, tile<2, kTallBlocks>, tile<3, kTallBlocks>,
                               tile<4, kTallBlocks>, tile<5, kTallBlocks>, tile<6, kTallBlocks>,
                               tile<7, kTallBlocks>, tile<8, kTallBlocks>, tile<9, kTallBlocks>,
                               tile<10, kTallBlocks>, tile<11, kTallBlocks>, tile<12, kTallBlocks>};
constexpr TileFn kSingle[13] = {nullptr, tile<1, 1>, tile<2, 1>, tile<3, 1>, tile<4, 1>, tile<5, 1>,
                                tile<6, 1>, tile<7, 1>, tile<8, 1>, tile<9, 1>, tile<10, 1>,
                                tile<11, 1>, tile<12, 1>};

// More rows: for each group of kTallBlocks output blocks, every row tile in turn, so the group's
// weights come from memory once and from L2 for the later tiles. The rows are split into tiles of
// nearly equal size (8 rows on AVX2: 4 + 4, not 6 + 2: a tile of few rows has too few independent
// accumulators to keep both FMA units busy). Each tile also prefetches its share of the next
// group's weights, so that memory streams during the later tiles too instead of idling.
inline void tall_rows(const float* x, const float* wp, float* y, int64_t M, int64_t K, int64_t N,
               const float* bias) {
  const int64_t blocks = N / kBlock, groups = blocks / kTallBlocks, group_lines = kTallBlocks * K;
  const int64_t ntiles = (M + kShortRows - 1) / kShortRows, base = M / ntiles, extra = M % ntiles;
  auto tiles = [&](const TileFn* fns, int64_t nb, bool next) {
    const float* ahead = wp + (nb + kTallBlocks) * K * kBlock;  // the next group's first line
    for (int64_t t = 0, m = 0; t < ntiles; ++t) {
      const int64_t rows = base + (t < extra ? 1 : 0);
      const int64_t first = group_lines * t / ntiles, lines = group_lines * (t + 1) / ntiles - first;
      fns[rows](x + m * K, wp, y + m * N, K, N, nb, bias, next ? ahead + first * kBlock : nullptr,
                next ? lines : 0);
      m += rows;
    }
  };
  at::parallel_for(0, groups, 4, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) tiles(kGroup, g * kTallBlocks, g + 1 < g1);
  });
  for (int64_t nb = groups * kTallBlocks; nb < blocks; ++nb) tiles(kSingle, nb, false);
}


// y[M, N] = x[M, K] @ W^T (+ bias), W packed [N/16][K][16], all contiguous float32.
inline void gemm(const float* x, const float* wp, float* y, int64_t M, int64_t K, int64_t N,
                 const float* bias) {
  if (M > kShortRows) {
    tall_rows(x, wp, y, M, K, N, bias);
  } else if (M > 0) {
    kShort[M](x, wp, y, K, N, bias);
  }
}

}  // namespace oilbird
