// GEMM over GGUF blocks on AMX tiles: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), the weights in the
// layouts of block_layouts.h, for CPUs with AMX (Intel Xeon since Sapphire Rapids).
//
// Why: the FMA kernel (q4_gemm.cpp) rebuilds each float32 weight and runs one FMA per weight and
// row, so past a few rows a forward costs what its FMAs cost (8 rows: 1.5x one row on SmolLM2).
// One AMX tile multiply does 16 rows x 16 outputs x 32 inputs of int8 products; a 16-row forward
// then costs little more than reading the blocks, like a one-row one.
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
// q is centred in the finish (q - c with c = 8 for 4-bit, 16 for 5-bit, the caller's `center` for
// bytes, and m + c d; an exact integer correction) so the two sums do not cancel. The OS must
// grant the process AMX's tile state (arch_prctl, once); amx_available() says whether it was
// built and granted.

#include <torch/extension.h>
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
#include <sys/syscall.h>
#include <unistd.h>

#include "amx_quads.h"
#endif

namespace {

constexpr int64_t kB = oilbird::blocks::kOutputs;  // outputs per block (one tile's 16 columns)
constexpr int kParts = 4;                            // int8 parts of x

#if defined(OILBIRD_AMX)

using oilbird::blocks::Quads;  // amx_quads.h

// Ask the kernel for the tile data state (Linux 5.16+): once per process, for every thread.
bool amx_granted() {
  static const bool granted = [] {
    constexpr long kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return granted;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

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

// x's rows as the kernels read them (see the top of the file).
struct Rows {
  int64_t M, K, G, groups;
  std::vector<int8_t> parts;   // [M][4][K]: a0, a1, a2, a3 of each row (a tile's rows 4 r + s)
  std::vector<int32_t> lead;   // [M][groups]: sum_k a0_k 2^7 + sum_k a1_k (for the centring)
  std::vector<int32_t> trail;  // [M][groups]: sum_k a2_k 2^7 + sum_k a3_k
  std::vector<float> scale;    // [M][groups]: 2^(e - 26), the weight of the combined parts' unit
  std::vector<float> sums;     // [M][groups]: sum of x over the group, in input order
  const int8_t* part(int s, int64_t r, int64_t g) const { return parts.data() + (r * kParts + s) * K + g * G; }
};

Rows split_rows(const float* x, int64_t M, int64_t K, int64_t G) {
  const int64_t groups = K / G, n = M * groups;
  // rows padded with zeros to a multiple of 4: a tile reads four rows' parts at a time
  Rows rows{M, K, G, groups, std::vector<int8_t>(kParts * ((M + 3) / 4 * 4) * K), std::vector<int32_t>(n), std::vector<int32_t>(n),
            std::vector<float>(n), std::vector<float>(n)};
  const __m512 step = _mm512_set1_ps(128.0f);
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int64_t r = 0; r < M; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const float* xg = x + r * K + g * G;
      const int64_t i = r * groups + g;
      float top = 0.0f, sum = 0.0f;
      for (int64_t k = 0; k < G; ++k) top = std::max(top, std::fabs(xg[k])), sum += xg[k];
      rows.sums[i] = sum;
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
          _mm_storeu_si128(reinterpret_cast<__m128i*>(rows.parts.data() + (r * kParts + s) * K + g * G + k),
                           _mm512_cvtepi32_epi8(ai));
          t = _mm512_mul_ps(_mm512_sub_ps(t, a), step);  // the rest, exact, in [-64, 64]
        }
      }
      rows.lead[i] = _mm512_reduce_add_epi32(count[0]) * 128 + _mm512_reduce_add_epi32(count[1]);
      rows.trail[i] = _mm512_reduce_add_epi32(count[2]) * 128 + _mm512_reduce_add_epi32(count[3]);
    }
  return rows;
}

// One group's four exact part sums for MT rows (c: [4][MT][16] int32) scaled into the accumulators:
// acc += d 2^(e-26) (((C0 2^7 + C1) - c lead) 2^14 + (C2 2^7 + C3) - c trail) + (m + c d) sum_x.
// The same code after either kernel: the same bits.
template <typename L, int MT>
inline void finish_group(__m512* acc, const int32_t* c, int64_t stride, int64_t row_stride, const uint8_t* p,
                         const Rows& rows, int64_t m0, int64_t g, int center) {
  __m512 d, m;
  L::scales(p, d, m);
  m = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(center)), d, m);  // the centred offset m + c d
  const __m512 unit = _mm512_set1_ps(16384.0f);
  for (int r = 0; r < MT; ++r) {
    const int64_t i = (m0 + r) * rows.groups + g;
    const auto at = [&](int s) { return _mm512_load_si512(c + s * stride + r * row_stride); };
    const __m512i hi = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(at(0), 7), at(1)),
                                        _mm512_set1_epi32(center * rows.lead[i]));
    const __m512i lo = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(at(2), 7), at(3)),
                                        _mm512_set1_epi32(center * rows.trail[i]));
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

// MT rows (MT <= 4) by NB blocks starting at block b on tiles. x's four parts are the tile's rows
// (4 r + s), so one tile multiply per group and block gives every part's sums; NB blocks' multiplies
// share x's tile and run as independent chains, and a group's sums are finished while the next
// group's multiplies run.
template <typename L, int MT, int NB>
void tile_blocks(const Rows& rows, const uint8_t* wp, float* y, int64_t N, int64_t m0, int64_t b, const float* bias,
                 int center) {
  const int64_t groups = rows.groups;
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
        Quads<L>::rows(p, qtile[j]);
      }
      _tile_loadd(7, rows.part(0, m0, g), rows.K);  // [4 MT, G] int8
      _tile_zero(0);
      _tile_loadd(4, qtile[0], 64);
      _tile_dpbsud(0, 7, 4);  // every part's sum_k a_k q_k: exact
      if constexpr (NB > 1) {
        _tile_zero(1);
        _tile_loadd(5, qtile[1], 64);
        _tile_dpbsud(1, 7, 5);
      }
      if constexpr (NB > 2) {
        _tile_zero(2);
        _tile_loadd(6, qtile[2], 64);
        _tile_dpbsud(2, 7, 6);
      }
    }
    if (g > 0)
      for (int j = 0; j < NB; ++j)
        finish_group<L, MT>(acc[j], part[(g - 1) & 1][j], 16, 64, wp + ((b + j) * groups + g - 1) * L::kBytes, rows,
                            m0, g - 1, center);
    if (g < groups) {
      _tile_stored(0, part[g & 1][0], 64);
      if constexpr (NB > 1) _tile_stored(1, part[g & 1][1], 64);
      if constexpr (NB > 2) _tile_stored(2, part[g & 1][2], 64);
    }
  }
  for (int j = 0; j < NB; ++j) store_rows<MT>(acc[j], y, N, m0, b + j, bias);
}

// MT rows (4 < MT <= 16) by one block on tiles: per group the block's q is turned into quads
// once and multiplied by each four rows' parts (tiles of 16 rows, the last one padded with zeros)
// into one accumulator tile per four rows; then all rows are finished.
template <typename L, int MT>
void tile_block_tall(const Rows& rows, const uint8_t* wp, float* y, int64_t N, int64_t m0, int64_t b,
                     const float* bias, int center) {
  constexpr int kPasses = (MT + 3) / 4;
  const int64_t groups = rows.groups;
  alignas(64) uint8_t qtile[8 * 64];
  alignas(64) int32_t part[kPasses][16 * 16];
  __m512 acc[MT];
  for (int r = 0; r < MT; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* p = wp + (b * groups + g) * L::kBytes;
    prefetch_group<L>(p);
    Quads<L>::rows(p, qtile);
    _tile_loadd(4, qtile, 64);
    // tmm0-3: each pass's sums; tmm6, tmm7: x's parts, alternately
    _tile_zero(0);
    _tile_loadd(6, rows.part(0, m0, g), rows.K);
    _tile_dpbsud(0, 6, 4);
    _tile_zero(1);
    _tile_loadd(7, rows.part(0, m0 + 4, g), rows.K);
    _tile_dpbsud(1, 7, 4);
    if constexpr (kPasses > 2) {
      _tile_zero(2);
      _tile_loadd(6, rows.part(0, m0 + 8, g), rows.K);
      _tile_dpbsud(2, 6, 4);
    }
    if constexpr (kPasses > 3) {
      _tile_zero(3);
      _tile_loadd(7, rows.part(0, m0 + 12, g), rows.K);
      _tile_dpbsud(3, 7, 4);
    }
    _tile_stored(0, part[0], 64);
    _tile_stored(1, part[1], 64);
    if constexpr (kPasses > 2) _tile_stored(2, part[2], 64);
    if constexpr (kPasses > 3) _tile_stored(3, part[3], 64);
    // rows 4 i .. 4 i + 3 from pass i (MT - 4 i of them in the last)
    finish_group<L, 4>(acc, part[0], 16, 64, p, rows, m0, g, center);
    if constexpr (MT > 4) finish_group<L, std::min(4, MT - 4)>(acc + 4, part[1], 16, 64, p, rows, m0 + 4, g, center);
    if constexpr (MT > 8) finish_group<L, std::min(4, MT - 8)>(acc + 8, part[2], 16, 64, p, rows, m0 + 8, g, center);
    if constexpr (MT > 12) finish_group<L, MT - 12>(acc + 12, part[3], 16, 64, p, rows, m0 + 12, g, center);
  }
  store_rows<MT>(acc, y, N, m0, b, bias);
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
    _tile_loadconfig(&cfg);
    int64_t b = b0;
    for (; b + 3 <= b1; b += 3) tile_blocks<L, MT, 3>(rows, wp, y, N, m0, b, bias, center);
    for (; b < b1; ++b) tile_blocks<L, MT, 1>(rows, wp, y, N, m0, b, bias, center);
  } else {
    for (int t = 0; t < 4; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;  // tmm0-3: each pass's sums, [16, 16] int32
    cfg.rows[4] = G / 4, cfg.colsb[4] = 64;                           // tmm4: q, G/4 quads x 16
    for (int t = 6; t < 8; ++t) cfg.rows[t] = 16, cfg.colsb[t] = G;   // tmm6-7: four rows' parts, [16, G] int8
    _tile_loadconfig(&cfg);
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
      Quads<L>::rows(p, qtile[j]);
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
      finish_group<L, 1>(&acc[j], part[j][0], 16, 0, wp + ((b + j) * groups + g) * L::kBytes, rows, m0, g, center);
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
    for (int64_t m0 = 0; m0 < M; m0 += 16)
      kTileRows<L>[std::min<int64_t>(16, M - m0)](rows, wp, y, N, m0, b0, b1, bias, center);
    _tile_release();
  });
}

#endif  // OILBIRD_AMX

}  // namespace

bool amx_available() {
#if defined(OILBIRD_AMX)
  return amx_granted();
#else
  return false;
#endif
}

// x [..., K] float32, packed by pack_q4 (320 or 384 bytes a group) or pack_q8 (`bytes` true; q - center
// centred), bias [N] or None -> y [..., N] float32 on AMX tiles.
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
