// Few-row GEMM kernels (AVX-512 or AVX2, see simd.h): y[M, N] = x[M, K] @ W[N, K]^T (+ bias)
// from W packed as [N/16][K][16], x and y float32, W float32 or bfloat16 (`Wt`: a bfloat16 weight
// is widened in registers, and every product and sum is float32). See skinny_gemm.cpp.
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
// Rows that the one-pass kernel serves: up to 14 on AVX-512 (two blocks of 14 rows fill the 28
// accumulators; 2-5% faster over a SmolLM2 forward's layers at 13-14 rows than the tall kernel's
// two tiles, scripts/kernel_ab.py), kShortRows on AVX2. Not 15-16: one block per pass needs a
// broadcast per FMA, and was 8% slower at 16 rows than the tall kernel's two tiles of 8.
constexpr int kOnePassRows = std::min(14, v::kAccumulators / kPer);
// Blocks per tile of kShortRows rows in the tall kernel: 2 (24 accumulators) or 1 (12).
constexpr int kTallBlocks = std::max(1, v::kAccumulators / (kShortRows * kPer));

// M rows by NB blocks of 16 outputs starting at block nb0, over all K. `ahead`, when given, is
// `ahead_lines` 64-byte lines of weights that a later call will read: they are prefetched evenly
// over the K steps, so the memory stream keeps going while this call reads its own from cache.
template <typename Wt, int M, int NB>
void block(const float* x, const Wt* wp, float* y, int64_t K, int64_t N, int64_t nb0,
           const float* bias, const Wt* ahead = nullptr, int64_t ahead_lines = 0) {
  v::vf acc[M][NB * kPer];
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB * kPer; ++b) acc[m][b] = v::zero();
  const Wt* w[NB];
  for (int b = 0; b < NB; ++b) w[b] = wp + (nb0 + b) * K * kBlock;
  int64_t credit = 0;  // ahead_lines per K steps: a line each time the credit passes K
  for (int64_t k = 0; k < K; ++k) {
    for (credit += ahead_lines; credit >= K; credit -= K, ahead += kBlock)
      _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T1);
    v::vf wv[NB * kPer];
    for (int b = 0; b < NB; ++b) {
      // Two distances: 96 lines (6 KiB) ahead into L2, which holds many more misses in flight
      // than L1, so the memory stream keeps its bandwidth; 16 lines ahead from there into L1.
      // One distance of 32 lines into L1 streamed 10-15% slower at 1-10 rows (Zen 4).
      _mm_prefetch(reinterpret_cast<const char*>(w[b] + (k + 16) * kBlock), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w[b] + (k + 96) * kBlock), _MM_HINT_T1);
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

// NB blocks of 16 outputs at a time, the groups split across threads; the blocks left over
// (N/16 not a multiple of NB) one at a time on the calling thread.
template <typename Wt, int M, int NB>
void spread(const float* x, const Wt* wp, float* y, int64_t K, int64_t N, const float* bias) {
  const int64_t blocks = N / kBlock, groups = blocks / NB;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) block<Wt, M, NB>(x, wp, y, K, N, g * NB, bias);
  });
  for (int64_t nb = groups * NB; nb < blocks; ++nb) block<Wt, M, 1>(x, wp, y, K, N, nb, bias);
}

// Up to kOnePassRows rows: one pass over the weights, NB blocks at a time (NB x M registers of
// accumulators within the budget, so a row count's registers never spill), the blocks split
// across threads. A small weight in groups of the widest NB leaves threads idle (SmolLM2's k and
// v projections: 12 blocks made 3 groups of 4, and one thread read all of them; its 36-block q
// and o split 5 groups against 4), so the group width is the widest of NB, 2 and 1 whose busiest
// thread reads the fewest blocks. Every output's sum is the same sequence of FMAs over k whatever
// its group or thread, so the width changes no bit.
template <typename Wt, int M>
void short_rows(const float* x, const Wt* wp, float* y, int64_t K, int64_t N, const float* bias) {
  constexpr int NB = std::max(1, std::min(4, v::kAccumulators / (M * kPer)));
  const int64_t blocks = N / kBlock, threads = std::max(1, at::get_num_threads());
  auto busiest = [&](int64_t nb) { return (blocks / nb + threads - 1) / threads * nb + blocks % nb; };
  if constexpr (NB > 2) {
    if (busiest(2) < busiest(NB) && busiest(2) <= busiest(1)) return spread<Wt, M, 2>(x, wp, y, K, N, bias);
  }
  if constexpr (NB > 1) {
    if (busiest(1) < busiest(NB) && (NB <= 2 || busiest(1) < busiest(2)))
      return spread<Wt, M, 1>(x, wp, y, K, N, bias);
  }
  spread<Wt, M, NB>(x, wp, y, K, N, bias);
}

template <typename Wt>
using ShortFn = void (*)(const float*, const Wt*, float*, int64_t, int64_t, const float*);
template <typename Wt>
constexpr ShortFn<Wt> kShort[15] = {nullptr, short_rows<Wt, 1>, short_rows<Wt, 2>, short_rows<Wt, 3>,
                                    short_rows<Wt, 4>, short_rows<Wt, 5>, short_rows<Wt, 6>,
                                    short_rows<Wt, 7>, short_rows<Wt, 8>, short_rows<Wt, 9>,
                                    short_rows<Wt, 10>, short_rows<Wt, 11>, short_rows<Wt, 12>,
                                    short_rows<Wt, 13>, short_rows<Wt, 14>};

template <typename Wt>
using TileFn = void (*)(const float*, const Wt*, float*, int64_t, int64_t, int64_t, const float*,
                        const Wt*, int64_t);
template <typename Wt, int M, int NB>
void tile(const float* x, const Wt* wp, float* y, int64_t K, int64_t N, int64_t nb, const float* b,
          const Wt* ahead, int64_t ahead_lines) {
  block<Wt, M, NB>(x, wp, y, K, N, nb, b, ahead, ahead_lines);
}
template <typename Wt, int NB>
constexpr TileFn<Wt> kTiles[13] = {nullptr, tile<Wt, 1, NB>, tile<Wt, 2, NB>, tile<Wt, 3, NB>,
                                   tile<Wt, 4, NB>, tile<Wt, 5, NB>, tile<Wt, 6, NB>, tile<Wt, 7, NB>,
                                   tile<Wt, 8, NB>, tile<Wt, 9, NB>, tile<Wt, 10, NB>,
                                   tile<Wt, 11, NB>, tile<Wt, 12, NB>};

// More rows: for each group of kTallBlocks output blocks, every row tile in turn, so the group's
// weights come from memory once and from L2 for the later tiles. The rows are split into tiles of
// nearly equal size (8 rows on AVX2: 4 + 4, not 6 + 2: a tile of few rows has too few independent
// accumulators to keep both FMA units busy). Each tile also prefetches its share of the next
// group's weights, so that memory streams during the later tiles too instead of idling.
template <typename Wt>
void tall_rows(const float* x, const Wt* wp, float* y, int64_t M, int64_t K, int64_t N,
               const float* bias) {
  const int64_t blocks = N / kBlock, groups = blocks / kTallBlocks, group_lines = kTallBlocks * K;
  const int64_t ntiles = (M + kShortRows - 1) / kShortRows, base = M / ntiles, extra = M % ntiles;
  auto tiles = [&](const TileFn<Wt>* fns, int64_t nb, bool next) {
    const Wt* ahead = wp + (nb + kTallBlocks) * K * kBlock;  // the next group's first line
    for (int64_t t = 0, m = 0; t < ntiles; ++t) {
      const int64_t rows = base + (t < extra ? 1 : 0);
      const int64_t first = group_lines * t / ntiles, lines = group_lines * (t + 1) / ntiles - first;
      fns[rows](x + m * K, wp, y + m * N, K, N, nb, bias, next ? ahead + first * kBlock : nullptr,
                next ? lines : 0);
      m += rows;
    }
  };
  at::parallel_for(0, groups, 4, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) tiles(kTiles<Wt, kTallBlocks>, g * kTallBlocks, g + 1 < g1);
  });
  for (int64_t nb = groups * kTallBlocks; nb < blocks; ++nb) tiles(kTiles<Wt, 1>, nb, false);
}


// y[M, N] = x[M, K] @ W^T (+ bias), W packed [N/16][K][16] (float32 or bfloat16), all contiguous.
template <typename Wt>
void gemm(const float* x, const Wt* wp, float* y, int64_t M, int64_t K, int64_t N, const float* bias) {
  if (M > kOnePassRows) {
    tall_rows<Wt>(x, wp, y, M, K, N, bias);
  } else if (M > 0) {
    kShort<Wt>[M](x, wp, y, K, N, bias);
  }
}

}  // namespace oilbird
