// GEMM over GGUF blocks on AMX tiles: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), the weights in the
// layouts of block_layouts.h, for CPUs with AMX (Intel Xeon since Sapphire Rapids).
//
// Why: the FMA kernel (q4_gemm.cpp) rebuilds each float32 weight and runs one FMA per weight and
// row, so past a few rows a forward costs what its FMAs cost (8 rows: 1.5x one row on SmolLM2).
// One AMX tile multiply does 16 x 16 x 64 int8 products. What it bought, measured on two Xeon
// cores (docs/RESULTS.md, issue 15, stop 48): level with the FMA kernel for tree forwards, 1.5-3x
// slower for prefills, because of the float32 finish each group of 32 inputs needs per row (below):
// not the default (`ForwardConfig.block_kernel`).
//
// The arithmetic, exact where it matters. A group's weights are w = d q + m (q a small unsigned
// integer), so per group g and output n: sum_k x_k w_k = d sum_k x_k q_k + m sum_k x_k. Each row's
// inputs of a group are written as x_k = 2^(e-5) v_k with max |v_k| < 64 and v_k = a0 + a1 2^-7 +
// a2 2^-14 + a3 2^-21 (+ under 2^-22: float32 precision at the group's largest input), the a's
// integers in [-64, 64]: int8. Each part's sum_k a_k q_k is then an exact int32, whoever computes
// it: the tiles for many rows, AVX512-VNNI dot products for few; one shared float32 finish
// combines the parts. So a row's result is the same bits at any row count, on either path: a tree
// forward gives each node a one-token step's bits (tests/test_amx_blocks.py). The bits differ from
// the FMA kernel's in the last places (another rounding), as oneDNN's or MKL's do.
//
// q is centred (q - c with c = 8 for 4-bit, 16 for 5-bit, the caller's `center` for bytes, and
// m + c d) so the two sums do not cancel: the tiles multiply the parts by q - c as signed bytes,
// the dot products (unsigned times signed) by q and subtract c times the parts' sums, the same
// integers. The OS must grant the process AMX's tile state (arch_prctl, once); amx_available()
// says whether it was built and granted.

#include <torch/types.h>  // not torch/extension.h: half the parse time; only skinny_gemm.cpp binds to Python
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "block_layouts.h"

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512BW__) && defined(__AVX512VBMI__) && \
    defined(__AVX512VNNI__) && defined(__BMI2__)
#define OILBIRD_AMX 1
#include "amx_quads.h"
#include "amx_rows.h"
#include "amx_tiles.h"
#endif

namespace {

constexpr int64_t kB = oilbird::blocks::kOutputs;  // outputs per block (one tile's 16 columns)

#if defined(OILBIRD_AMX)

using oilbird::amx::finish_group;  // amx_rows.h
using oilbird::amx::kParts;
using oilbird::amx::Rows;
using oilbird::amx::split_rows;
using oilbird::amx::store_rows;
using oilbird::blocks::Quads;  // amx_quads.h

using oilbird::amx::load_config;  // amx_tiles.h
using oilbird::amx::TileConfig;

// Far ahead into L2 (the memory stream), near ahead into L1, every line of the group, as the FMA
// kernel does (q4_gemm.cpp).
template <typename L>
inline void prefetch_group(const uint8_t* p) {
  constexpr int64_t kLines = (L::kBytes + 63) / 64;
  for (int64_t l = 0; l < kLines; ++l) {
    _mm_prefetch(reinterpret_cast<const char*>(p + 16 * L::kBytes + l * 64), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(p + 3 * L::kBytes + l * 64), _MM_HINT_T0);
  }
}

// MT rows (MT <= 4) by NB blocks starting at block b on tiles. x's four parts are the tile's rows
// (4 r + s), so one tile multiply per group and block gives every part's sums; NB blocks' multiplies
// share x's tile and run as independent chains, and a group's sums are finished while the next
// group's multiplies run.
template <typename L, int MT, int NB>
void tile_blocks(const Rows& rows, const uint8_t* wp, float* y, int64_t N, int64_t m0, int64_t b, const float* bias,
                 int center) {
  const int64_t groups = rows.groups;
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(center));
  alignas(64) uint8_t qtile[NB][8 * 64];
  alignas(64) int32_t part[2][NB][16 * 16];  // two groups in flight
  __m512 acc[NB][MT];
  for (int j = 0; j < NB; ++j)
    for (int r = 0; r < MT; ++r) acc[j][r] = _mm512_setzero_ps();
  for (int64_t g = 0; g <= groups; ++g) {
    if (g < groups) {
      for (int j = 0; j < NB; ++j) {
        const uint8_t* p = wp + ((b + j) * groups + g) * L::kBytes;
        prefetch_group<L>(p);
        Quads<L>::rows(p, qtile[j], offset);
      }
      _tile_loadd(7, rows.part(0, m0, g), rows.K);  // [4 MT, G] int8
      _tile_zero(0);
      _tile_loadd(4, qtile[0], 64);
      _tile_dpbssd(0, 7, 4);  // every part's sum_k a_k (q_k - c): exact
      if constexpr (NB > 1) {
        _tile_zero(1);
        _tile_loadd(5, qtile[1], 64);
        _tile_dpbssd(1, 7, 5);
      }
      if constexpr (NB > 2) {
        _tile_zero(2);
        _tile_loadd(6, qtile[2], 64);
        _tile_dpbssd(2, 7, 6);
      }
    }
    if (g > 0)
      for (int j = 0; j < NB; ++j)
        finish_group<L, MT, true>(acc[j], part[(g - 1) & 1][j], 16, 64, wp + ((b + j) * groups + g - 1) * L::kBytes, rows,
                            m0, g - 1, center);
    if (g < groups) {
      _tile_stored(0, part[g & 1][0], 64);
      if constexpr (NB > 1) _tile_stored(1, part[g & 1][1], 64);
      if constexpr (NB > 2) _tile_stored(2, part[g & 1][2], 64);
    }
  }
  for (int j = 0; j < NB; ++j) store_rows<MT>(acc[j], y, N, m0, b + j, bias);
}

// Tiles for 16-row passes (the tall and wide paths): tmm0-3 four passes' sums, [16, 16] int32;
// tmm4 q - c, G/4 quads x 16 outputs; tmm6-7 four rows' parts, [16, G] int8, alternately.
template <typename L>
void configure_passes() {
  TileConfig cfg;
  for (int t = 0; t < 4; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  cfg.rows[4] = L::kInputs / 4, cfg.colsb[4] = 64;
  for (int t = 6; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = L::kInputs;
  load_config(cfg);
}

// kPasses passes of four rows from row r0, group g: pass i's sums of every part times q - c (in
// tmm4) into tmm i. (Tile numbers are instruction immediates: hence the unrolled passes.)
template <int kPasses>
inline void multiply_passes(const Rows& rows, int64_t r0, int64_t g) {
  _tile_zero(0);
  _tile_loadd(6, rows.part(0, r0, g), rows.K);
  _tile_dpbssd(0, 6, 4);
  if constexpr (kPasses > 1) {
    _tile_zero(1);
    _tile_loadd(7, rows.part(0, r0 + 4, g), rows.K);
    _tile_dpbssd(1, 7, 4);
  }
  if constexpr (kPasses > 2) {
    _tile_zero(2);
    _tile_loadd(6, rows.part(0, r0 + 8, g), rows.K);
    _tile_dpbssd(2, 6, 4);
  }
  if constexpr (kPasses > 3) {
    _tile_zero(3);
    _tile_loadd(7, rows.part(0, r0 + 12, g), rows.K);
    _tile_dpbssd(3, 7, 4);
  }
}

// Pass i's sums (tmm i) stored to parts[i], [16, 16] int32 each.
template <int kPasses>
inline void store_passes(int32_t (*parts)[16 * 16]) {
  _tile_stored(0, parts[0], 64);
  if constexpr (kPasses > 1) _tile_stored(1, parts[1], 64);
  if constexpr (kPasses > 2) _tile_stored(2, parts[2], 64);
  if constexpr (kPasses > 3) _tile_stored(3, parts[3], 64);
}

// MT rows (4 < MT <= 16) by one block on tiles: per group the block's q - c is turned into quads
// once and multiplied by each four rows' parts (tiles of 16 rows, the last one padded with zeros)
// into one accumulator tile per four rows; a group's sums are finished while the next group's
// multiplies run.
template <typename L, int MT>
void tile_block_tall(const Rows& rows, const uint8_t* wp, float* y, int64_t N, int64_t m0, int64_t b,
                     const float* bias, int center) {
  constexpr int kPasses = (MT + 3) / 4;
  const int64_t groups = rows.groups;
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(center));
  alignas(64) uint8_t qtile[8 * 64];
  alignas(64) int32_t part[2][kPasses][16 * 16];  // two groups in flight
  __m512 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  const uint8_t* w = wp + b * groups * L::kBytes;
  for (int64_t g = 0; g <= groups; ++g) {
    if (g < groups) {
      const uint8_t* p = w + g * L::kBytes;
      prefetch_group<L>(p);
      Quads<L>::rows(p, qtile, offset);
      _tile_loadd(4, qtile, 64);
      multiply_passes<kPasses>(rows, m0, g);
    }
    if (g > 0) {  // rows 4 i .. 4 i + 3 from pass i (MT - 4 i of them in the last)
      const uint8_t* p = w + (g - 1) * L::kBytes;
      auto& prev = part[(g - 1) & 1];
      finish_group<L, 4, true>(acc, prev[0], 16, 64, p, rows, m0, g - 1, center);
      finish_group<L, std::min(4, MT - 4), true>(acc + 4, prev[1], 16, 64, p, rows, m0 + 4, g - 1, center);
      if constexpr (MT > 8) finish_group<L, std::min(4, MT - 8), true>(acc + 8, prev[2], 16, 64, p, rows, m0 + 8, g - 1, center);
      if constexpr (MT > 12) finish_group<L, MT - 12, true>(acc + 12, prev[3], 16, 64, p, rows, m0 + 12, g - 1, center);
    }
    if (g < groups) store_passes<kPasses>(part[g & 1]);
  }
  store_rows<MT>(acc, y, N, m0, b, bias);
}

// All M rows (M > 16) by one block on tiles, for prefills: per group the block's q - c is turned
// into quads once and multiplied by every 16 rows' parts, four tiles of four rows each; a chunk's
// sums are finished (into `accs`, [M padded to 16][16] float32) while the next chunk's run.
template <typename L>
void tile_block_wide(const Rows& rows, const uint8_t* wp, float* y, int64_t N, int64_t b, const float* bias,
                     int center, float* accs) {
  const int64_t groups = rows.groups, chunks = (rows.M + 15) / 16;
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(center));
  alignas(64) uint8_t qtile[8 * 64];
  alignas(64) int32_t part[2][4][16 * 16];  // two chunks in flight
  std::fill(accs, accs + chunks * 16 * 16, 0.0f);
  const uint8_t* w = wp + b * groups * L::kBytes;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* p = w + g * L::kBytes;
    prefetch_group<L>(p);
    Quads<L>::rows(p, qtile, offset);
    _tile_loadd(4, qtile, 64);
    for (int64_t c = 0; c <= chunks; ++c) {
      if (c < chunks) multiply_passes<4>(rows, 16 * c, g);
      if (c > 0)
        for (int i = 0; i < 4; ++i) {
          const int64_t r0 = 16 * (c - 1) + 4 * i;
          __m512 acc[4];
          for (int r = 0; r < 4; ++r) acc[r] = _mm512_loadu_ps(accs + (r0 + r) * 16);  // (a vector's alignment: 16 bytes)
          finish_group<L, 4, true>(acc, part[(c - 1) & 1][i], 16, 64, p, rows, r0, g, center);
          for (int r = 0; r < 4; ++r) _mm512_storeu_ps(accs + (r0 + r) * 16, acc[r]);
        }
      if (c < chunks) store_passes<4>(part[c & 1]);
    }
  }
  for (int64_t r = 0; r < rows.M; ++r) {
    __m512 out = _mm512_loadu_ps(accs + r * 16);
    if (bias) out = _mm512_add_ps(out, _mm512_loadu_ps(bias + b * kB));  // after the sum
    _mm512_storeu_ps(y + r * N + b * kB, out);
  }
}

template <typename L, int MT>
void tile_rows(const Rows& rows, const uint8_t* wp, float* y, int64_t N, int64_t m0, int64_t b0, int64_t b1,
               const float* bias, int center) {
  constexpr int64_t G = L::kInputs;
  TileConfig cfg;
  if constexpr (MT <= 4) {
    for (int t = 0; t < 3; ++t) cfg.rows[t] = 4 * MT, cfg.colsb[t] = 64;  // tmm0-2: sums of 3 blocks, [4 MT, 16] int32
    for (int t = 4; t < 7; ++t) cfg.rows[t] = G / 4, cfg.colsb[t] = 64;   // tmm4-6: q of 3 blocks, G/4 quads x 16
    cfg.rows[7] = 4 * MT, cfg.colsb[7] = G;                               // tmm7: x's parts, [4 MT, G] int8
    load_config(cfg);
    int64_t b = b0;
    for (; b + 3 <= b1; b += 3) tile_blocks<L, MT, 3>(rows, wp, y, N, m0, b, bias, center);
    for (; b < b1; ++b) tile_blocks<L, MT, 1>(rows, wp, y, N, m0, b, bias, center);
  } else {
    configure_passes<L>();
    for (int64_t b = b0; b < b1; ++b) tile_block_tall<L, MT>(rows, wp, y, N, m0, b, bias, center);
  }
}

template <typename L>
using TileRowsFn = void (*)(const Rows&, const uint8_t*, float*, int64_t, int64_t, int64_t, int64_t, const float*, int);
template <typename L>
constexpr TileRowsFn<L> kTileRows[17] = {
    nullptr, tile_rows<L, 1>, tile_rows<L, 2>, tile_rows<L, 3>, tile_rows<L, 4>, tile_rows<L, 5>,
    tile_rows<L, 6>, tile_rows<L, 7>, tile_rows<L, 8>, tile_rows<L, 9>, tile_rows<L, 10>, tile_rows<L, 11>,
    tile_rows<L, 12>, tile_rows<L, 13>, tile_rows<L, 14>, tile_rows<L, 15>, tile_rows<L, 16>};

// One row by NB blocks starting at block b on VNNI dot products: the same exact part sums as the
// tiles' (4 NB independent chains hide the dot products' latency), the same finish.
template <typename L, int NB>
void dot_blocks(const Rows& rows, const uint8_t* wp, float* y, int64_t N, int64_t m0, int64_t b, const float* bias,
                int center) {
  constexpr int64_t G = L::kInputs;
  const int64_t groups = rows.groups;
  alignas(64) uint8_t qtile[NB][8 * 64];
  alignas(64) int32_t part[NB][kParts][16];
  __m512 acc[NB];
  for (int j = 0; j < NB; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    for (int j = 0; j < NB; ++j) {
      const uint8_t* p = wp + ((b + j) * groups + g) * L::kBytes;
      prefetch_group<L>(p);
      Quads<L>::rows(p, qtile[j], _mm512_setzero_si512());
    }
    __m512i sum[NB][kParts];
    for (int j = 0; j < NB; ++j)
      for (int s = 0; s < kParts; ++s) sum[j][s] = _mm512_setzero_si512();
    for (int64_t kq = 0; kq < G / 4; ++kq) {
      __m512i xv[kParts];
      for (int s = 0; s < kParts; ++s) {
        int32_t quad;
        std::memcpy(&quad, rows.part(s, m0, g) + 4 * kq, 4);
        xv[s] = _mm512_set1_epi32(quad);
      }
      for (int j = 0; j < NB; ++j) {
        const __m512i qv = _mm512_load_si512(qtile[j] + kq * 64);
        for (int s = 0; s < kParts; ++s) sum[j][s] = _mm512_dpbusd_epi32(sum[j][s], qv, xv[s]);
      }
    }
    for (int j = 0; j < NB; ++j) {
      for (int s = 0; s < kParts; ++s) _mm512_store_si512(part[j][s], sum[j][s]);
      finish_group<L, 1, false>(&acc[j], part[j][0], 16, 0, wp + ((b + j) * groups + g) * L::kBytes, rows, m0, g, center);
    }
  }
  for (int j = 0; j < NB; ++j) store_rows<1>(&acc[j], y, N, m0, b + j, bias);
}

template <typename L>
void dot_rows(const Rows& rows, const uint8_t* wp, float* y, int64_t N, int64_t m0, int64_t b0, int64_t b1,
              const float* bias, int center) {
  constexpr int NB = 2;
  int64_t b = b0;
  for (; b + NB <= b1; b += NB) dot_blocks<L, NB>(rows, wp, y, N, m0, b, bias, center);
  for (; b < b1; ++b) dot_blocks<L, 1>(rows, wp, y, N, m0, b, bias, center);
}

template <typename L>
void amx_gemm(const float* x, const uint8_t* wp, float* y, int64_t M, int64_t K, int64_t N, const float* bias,
              int center, int64_t dot_max) {
  const int64_t blocks = N / kB;
  const Rows rows = split_rows(x, M, K, L::kInputs);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    if (M <= dot_max) {  // few rows: the dot products (same bits, no tile set-up)
      for (int64_t m0 = 0; m0 < M; ++m0) dot_rows<L>(rows, wp, y, N, m0, b0, b1, bias, center);
      return;
    }
    if (M <= 16) {
      kTileRows<L>[M](rows, wp, y, N, 0, b0, b1, bias, center);
    } else {  // a prefill: each group's quads once for all rows
      configure_passes<L>();
      std::vector<float> accs((M + 15) / 16 * 16 * 16);
      for (int64_t b = b0; b < b1; ++b) tile_block_wide<L>(rows, wp, y, N, b, bias, center, accs.data());
    }
    _tile_release();
  });
}

#endif  // OILBIRD_AMX

}  // namespace

bool amx_available() {
#if defined(OILBIRD_AMX)
  return oilbird::amx::tiles_granted();
#else
  return false;
#endif
}

// x [..., K] float32, packed by pack_q4 (320 or 384 bytes a group; centred by 8 or 16) or pack_q8
// (`bytes` true; centred by `center`, which only the byte plane reads), bias [N] or None ->
// y [..., N] float32. Forwards of at most `dot_max` rows run on VNNI dot products, more on tiles.
torch::Tensor linear_amx(const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>& bias,
                         bool bytes, int64_t center, int64_t dot_max) {
  TORCH_CHECK(amx_available(), "linear_amx: AMX is not built here or the OS did not grant its tile state");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kUInt8 &&
                  (bytes ? packed.size(2) == 384 : (packed.size(2) == 320 || packed.size(2) == 384)),
              "linear_amx: a weight packed by pack_q4 or pack_q8");
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == torch::kFloat32, "linear_amx: x must be a float32 tensor [..., K]");
  const int64_t inputs = bytes ? 16 : 32, K = packed.size(1) * inputs, N = packed.size(0) * kB;
  TORCH_CHECK(x.size(-1) == K, "linear_amx: x has ", x.size(-1), " features, the weight ", K);
  TORCH_CHECK(!bias.has_value() || (bias->scalar_type() == torch::kFloat32 && bias->numel() == N && bias->is_contiguous()),
              "linear_amx: bias must be a contiguous float32 [N]");
  TORCH_CHECK(center >= 0 && center <= 128, "linear_amx: center must be in 0..128");
  const auto rows = x.reshape({-1, K}).contiguous();  // [M, K]
  auto out_shape = x.sizes().vec();
  out_shape.back() = N;
  auto y = torch::empty(out_shape, x.options());  // [..., N]
#if defined(OILBIRD_AMX)
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const int64_t M = rows.size(0);
  if (M > 0) {
    namespace ob = oilbird::blocks;
    if (bytes)
      amx_gemm<ob::Bytes>(rows.data_ptr<float>(), packed.data_ptr<uint8_t>(), y.data_ptr<float>(), M, K, N, b,
                          static_cast<int>(center), dot_max);
    else if (packed.size(2) == 384)  // Q5_0: q - 16
      amx_gemm<ob::FiveBits>(rows.data_ptr<float>(), packed.data_ptr<uint8_t>(), y.data_ptr<float>(), M, K, N, b,
                             16, dot_max);
    else  // 4-bit: q - 8
      amx_gemm<ob::Nibbles>(rows.data_ptr<float>(), packed.data_ptr<uint8_t>(), y.data_ptr<float>(), M, K, N, b,
                            8, dot_max);
  }
#endif
  return y;
}
