// Few-row fp32 GEMM kernels (AVX-512): y[M, N] = x[M, K] @ W[N, K]^T (+ bias) from W packed as
// [N/16][K][16]. See skinny_gemm.cpp for why and how; tree_attention.cpp uses them too.
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace oilbird {

constexpr int64_t kBlock = 16;  // outputs per AVX-512 register of fp32

// M rows by NB blocks of 16 outputs starting at block nb0, over all K.
template <int M, int NB>
void block(const float* x, const float* wp, float* y, int64_t K, int64_t N, int64_t nb0,
           const float* bias) {
  __m512 acc[M][NB];
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_setzero_ps();
  const float* w[NB];
  for (int b = 0; b < NB; ++b) w[b] = wp + (nb0 + b) * K * kBlock;
  for (int64_t k = 0; k < K; ++k) {
    __m512 wv[NB];
    for (int b = 0; b < NB; ++b) {
      // 32 lines (2 KiB) ahead: the stream stays ahead of the FMAs.
      _mm_prefetch(reinterpret_cast<const char*>(w[b] + (k + 32) * kBlock), _MM_HINT_T0);
      wv[b] = _mm512_loadu_ps(w[b] + k * kBlock);
    }
    for (int m = 0; m < M; ++m) {
      __m512 xv = _mm512_set1_ps(x[m * K + k]);
      for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_fmadd_ps(xv, wv[b], acc[m][b]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB; ++b) {
      __m512 r = acc[m][b];
      if (bias) r = _mm512_add_ps(r, _mm512_loadu_ps(bias + (nb0 + b) * kBlock));
      _mm512_storeu_ps(y + m * N + (nb0 + b) * kBlock, r);
    }
}

// Up to 12 rows: one pass over the weights, NB blocks at a time (NB x M <= 28 accumulators, so
// a row count's registers never spill), the blocks split across threads.
template <int M>
void short_rows(const float* x, const float* wp, float* y, int64_t K, int64_t N, const float* bias) {
  constexpr int NB = std::max(1, std::min(4, 28 / M));
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

using TileFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, const float*);
template <int M, int NB>
void tile(const float* x, const float* wp, float* y, int64_t K, int64_t N, int64_t nb, const float* b) {
  block<M, NB>(x, wp, y, K, N, nb, b);
}
constexpr TileFn kPair[13] = {nullptr, tile<1, 2>, tile<2, 2>, tile<3, 2>, tile<4, 2>, tile<5, 2>,
                              tile<6, 2>, tile<7, 2>, tile<8, 2>, tile<9, 2>, tile<10, 2>,
                              tile<11, 2>, tile<12, 2>};
constexpr TileFn kSingle[13] = {nullptr, tile<1, 1>, tile<2, 1>, tile<3, 1>, tile<4, 1>, tile<5, 1>,
                                tile<6, 1>, tile<7, 1>, tile<8, 1>, tile<9, 1>, tile<10, 1>,
                                tile<11, 1>, tile<12, 1>};

// More rows: for each pair of output blocks, every 12-row tile in turn, so the pair's weights
// come from memory once and from L2 for the later tiles (12 rows x 2 blocks: 24 accumulators,
// 14 loads per 24 FMAs).
inline void tall_rows(const float* x, const float* wp, float* y, int64_t M, int64_t K, int64_t N,
               const float* bias) {
  const int64_t blocks = N / kBlock, pairs = blocks / 2;
  auto tiles = [&](const TileFn* fns, int64_t nb) {
    for (int64_t m = 0; m < M; m += 12) {
      const int64_t rows = std::min<int64_t>(12, M - m);
      fns[rows](x + m * K, wp, y + m * N, K, N, nb, bias);
    }
  };
  at::parallel_for(0, pairs, 4, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) tiles(kPair, 2 * p);
  });
  if (blocks % 2) tiles(kSingle, blocks - 1);
}


// y[M, N] = x[M, K] @ W^T (+ bias), W packed [N/16][K][16], all contiguous float32.
inline void gemm(const float* x, const float* wp, float* y, int64_t M, int64_t K, int64_t N,
                 const float* bias) {
  if (M > 12) {
    tall_rows(x, wp, y, M, K, N, bias);
  } else if (M > 0) {
    kShort[M](x, wp, y, K, N, bias);
  }
}

}  // namespace oilbird
