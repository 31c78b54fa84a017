// Approximate LM-head logits on AVX512-VNNI int8 dot products, from the head's Q8_0 blocks, with
// a per-row bound on their error: the input half of oilbird/int8_head.py's certified head.
//
// Why: greedy verification needs each row's float32 top-k, not its logits. A Q8_0 head is
// w = d q (q a signed byte, d one float per 32 inputs). Rounding each row's inputs to bytes too
// (x ~ s a, one scale s per 32 inputs, a in [-127, 127]) makes every group's sum an exact int32
// of 32 byte products, 64 of which one vpdpbusd adds (four float32 FMAs' worth). A few rows
// stream the head once, as one row does; at one row the head is read from 1.125 bytes a weight
// against the byte plane's 1.5 (q4_gemm.cpp: d and m as floats per 16 inputs).
//
// The bound. Per row n with inputs x and their rounding x^ = s a (real numbers), and token v:
//     |u~[v] - x . w[v]| <= ||w[v]|| * (||x - x^|| + gamma_{G+2} ||x^||),
// the first term by Cauchy-Schwarz (sum w (x^ - x)), the second the float32 finish: each group's
// exact int32 I_g (below 2^24, so exact in float32) times fl(d_g s_g), summed by FMA over G
// groups. `int8_head_logits` returns the bracket per row (rounded up); oilbird/int8_head.py adds
// the recomputation's terms and hands it to certified_topk_rows.
//
// vpdpbusd multiplies unsigned by signed bytes, and the signed side can be a broadcast from
// memory: the weights are stored as q + 128 (unsigned) and the row's bytes broadcast, so a group
// sums (q + 128) . a = I + 128 A with A = sum a, taken off per row and group.
//
// Layout ("pack_int8_head"): [V/16][G][576] bytes: per 16 tokens and 32 inputs, eight 64-byte
// lines (line j: the 16 tokens' inputs 4j..4j+3, four bytes a token, vpdpbusd's order), then the
// 16 tokens' d as float32. Threads: ATen's pool splits the blocks of 16 tokens.
//
// Two paths give u the same bits: VNNI dot products (any AVX512-VNNI CPU) and, where AMX-INT8
// runs, tiles (`block_tiles`: the same exact int32 group sums, 16 rows per multiply), which past a
// few rows cost less; the caller picks by the row count (oilbird/int8_head.py).

#include <torch/types.h>  // not torch/extension.h: half the parse time; only skinny_gemm.cpp binds to Python
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VNNI__)
#define OILBIRD_AMX_HEAD 1
#include "amx_tiles.h"
#endif

namespace {

constexpr int64_t kTokens = 16;               // outputs per block: one register of int32 sums
constexpr int64_t kGroup = 32;                // inputs per Q8_0 block
constexpr int64_t kLineBytes = 64;
constexpr int64_t kWeightBytes = kTokens * kGroup;  // 512: eight lines
constexpr int64_t kGroupBytes = kWeightBytes + kTokens * 4;  // + 16 float32 d
constexpr int64_t kMaxRows = 8;               // rows per pass over a block (accumulators in registers)

}  // namespace

bool int8_head_available() {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
  return true;
#else
  return false;
#endif
}

// q [V, K] uint8 (Q8_0's q + 128), d [V, K/32] float32 -> [V/16, K/32, 576] bytes (the layout above).
torch::Tensor pack_int8_head(const torch::Tensor& q, const torch::Tensor& d) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == torch::kUInt8, "pack_int8_head: q must be a 2-D uint8 tensor");
  const int64_t V = q.size(0), K = q.size(1);
  TORCH_CHECK(V % kTokens == 0 && K % kGroup == 0, "pack_int8_head: vocabulary must be a multiple of 16, inputs of 32");
  TORCH_CHECK(d.dim() == 2 && d.scalar_type() == torch::kFloat32 && d.size(0) == V && d.size(1) == K / kGroup,
              "pack_int8_head: d must be float32 [V, K/32]");
  const int64_t G = K / kGroup;
  // [V/16, 16 tokens, G, 8 lines, 4] -> [V/16, G, 8 lines, 16 tokens, 4]
  auto lines = q.contiguous().view({V / kTokens, kTokens, G, 8, 4}).permute({0, 2, 3, 1, 4}).contiguous()
                   .view({V / kTokens, G, kWeightBytes});
  auto scales = d.contiguous().view({V / kTokens, kTokens, G}).transpose(1, 2).contiguous()
                    .view(torch::kUInt8).view({V / kTokens, G, kTokens * 4});
  return torch::cat({lines, scales}, 2).contiguous();
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
namespace {

// Row x [K] -> bytes a [K], per group its scale s and 128 * sum(a), and the row's bound bracket.
float quantize_row(const float* x, int64_t K, int8_t* a, float* s, int32_t* corr) {
  double err2 = 0, norm2 = 0;
  bool finite = true;
  for (int64_t g = 0; g < K / kGroup; ++g) {
    const float* xg = x + g * kGroup;
    float top = 0;
    for (int64_t i = 0; i < kGroup; ++i) {
      finite = finite && std::isfinite(xg[i]);
      top = std::max(top, std::fabs(xg[i]));
    }
    const float scale = top / 127.0f;
    const float inv = scale > 0 ? 1.0f / scale : 0.0f;
    int32_t sum = 0;
    for (int64_t i = 0; i < kGroup; ++i) {
      const int32_t v = finite ? std::clamp(static_cast<int32_t>(std::nearbyint(xg[i] * inv)), -127, 127) : 0;
      a[g * kGroup + i] = static_cast<int8_t>(v);
      sum += v;
      const double rebuilt = double(scale) * v;  // x^, exact in double
      err2 += (double(xg[i]) - rebuilt) * (double(xg[i]) - rebuilt);
      norm2 += rebuilt * rebuilt;
    }
    s[g] = scale;
    corr[g] = 128 * sum;
  }
  if (!finite) return NAN;  // no bound holds; certified_topk_rows then keeps u's own order
  const double G = double(K / kGroup), gamma = (G + 2) * std::ldexp(1.0, -24) / (1 - (G + 2) * std::ldexp(1.0, -24));
  return static_cast<float>((std::sqrt(err2) + gamma * std::sqrt(norm2)) * (1 + 1e-6));  // rounded up
}

// Rows [R] of one block of 16 tokens over all groups -> y[r * ldy + 0..15].
template <int R>
void block_rows(const uint8_t* block, const int8_t* a, const float* s, const int32_t* corr, int64_t K,
                int64_t G, float* y, int64_t ldy) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* p = block + g * kGroupBytes;
    _mm_prefetch(reinterpret_cast<const char*>(p + 4 * kGroupBytes), _MM_HINT_T0);
    __m512i w[8];
    for (int j = 0; j < 8; ++j) w[j] = _mm512_loadu_si512(p + j * kLineBytes);
    const __m512 dv = _mm512_loadu_ps(reinterpret_cast<const float*>(p + kWeightBytes));
    for (int r = 0; r < R; ++r) {
      const int32_t* ar = reinterpret_cast<const int32_t*>(a + r * K + g * kGroup);
      // Two chains of four: a dot product waits on the one before it in its chain.
      __m512i even = _mm512_set1_epi32(-corr[r * G + g]), odd = _mm512_setzero_si512();  // -128 A: (q + 128) . a - 128 A = q . a
      for (int j = 0; j < 8; j += 2) {
        even = _mm512_dpbusd_epi32(even, w[j], _mm512_set1_epi32(ar[j]));
        odd = _mm512_dpbusd_epi32(odd, w[j + 1], _mm512_set1_epi32(ar[j + 1]));
      }
      const __m512i sum = _mm512_add_epi32(even, odd);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dv, _mm512_set1_ps(s[r * G + g])), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(y + r * ldy, acc[r]);
}

using BlockRows = void (*)(const uint8_t*, const int8_t*, const float*, const int32_t*, int64_t, int64_t, float*, int64_t);
constexpr BlockRows kBlockRows[kMaxRows] = {block_rows<1>, block_rows<2>, block_rows<3>, block_rows<4>,
                                            block_rows<5>, block_rows<6>, block_rows<7>, block_rows<8>};

#if defined(OILBIRD_AMX_HEAD)
// The same sums on AMX int8 tiles: one TDPBSUD per group and block multiplies 16 rows' bytes
// (signed, A: [16 rows, 32 bytes]) by the group's eight lines (unsigned, B: [8, 64], the layout
// above: line j holds the 16 tokens' inputs 4j..4j+3, four bytes a token, as a B tile's rows do)
// into (q + 128) . a per row and token, exact in int32; taking off 128 A leaves the very integer
// the VNNI path sums, and the finish is the same float32 operations in the same group order, so
// u has the same bits on either path. Why: the VNNI path spends ~20 instructions per row and
// group, so past a few rows the head costs its arithmetic; here a row and group cost a load, a
// subtract, a conversion, a multiply and an FMA.
//
// `a` holds N rows rounded up to 16 (the rows past N zero); each tile of 16 rows runs over every
// group of two blocks (one A tile for both). The three jobs of a group are staggered so that none
// waits on another's result: group g's multiplies are issued, group g - 1's sums (multiplied an
// iteration ago) stored, group g - 2's finished from memory (a ring of three).
template <bool kTwo>
void block_tiles(const uint8_t* block, const int8_t* a, const float* s, const int32_t* corr, int64_t N,
                 int64_t K, int64_t G, float* y, int64_t ldy) {
  constexpr int nb = kTwo ? 2 : 1;
  alignas(64) int32_t c[3][2][16 * 16];  // [group % 3][block][row, token]
  const uint8_t* second = block + G * kGroupBytes;  // the next block of 16 tokens
  for (int64_t r0 = 0; r0 < N; r0 += 16) {
    const int64_t R = std::min<int64_t>(16, N - r0);
    __m512 acc[2][16];
    for (int j = 0; j < nb; ++j)
      for (int r = 0; r < 16; ++r) acc[j][r] = _mm512_setzero_ps();
    auto multiply = [&](int64_t g) {  // into tmm0 / tmm4 (g even) or tmm1 / tmm5: tile numbers are immediates
      _tile_loadd(2, a + r0 * K + g * kGroup, K);
      _tile_loadd(3, block + g * kGroupBytes, kLineBytes);
      if constexpr (kTwo) _tile_loadd(6, second + g * kGroupBytes, kLineBytes);
      if (g % 2 == 0) {
        _tile_zero(0);
        _tile_dpbsud(0, 2, 3);
        if constexpr (kTwo) {
          _tile_zero(4);
          _tile_dpbsud(4, 2, 6);
        }
      } else {
        _tile_zero(1);
        _tile_dpbsud(1, 2, 3);
        if constexpr (kTwo) {
          _tile_zero(5);
          _tile_dpbsud(5, 2, 6);
        }
      }
    };
    auto store = [&](int64_t g) {
      if (g % 2 == 0) {
        _tile_stored(0, c[g % 3][0], 64);
        if constexpr (kTwo) _tile_stored(4, c[g % 3][1], 64);
      } else {
        _tile_stored(1, c[g % 3][0], 64);
        if constexpr (kTwo) _tile_stored(5, c[g % 3][1], 64);
      }
    };
    auto finish = [&](int64_t g) {
      for (int j = 0; j < nb; ++j) {
        const uint8_t* p = (j == 0 ? block : second) + g * kGroupBytes;
        const __m512 dv = _mm512_loadu_ps(reinterpret_cast<const float*>(p + kWeightBytes));
        const int32_t* cg = c[g % 3][j];
        for (int64_t r = 0; r < R; ++r) {
          const __m512i sum = _mm512_sub_epi32(_mm512_load_si512(cg + r * 16), _mm512_set1_epi32(corr[(r0 + r) * G + g]));
          acc[j][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dv, _mm512_set1_ps(s[(r0 + r) * G + g])),
                                      acc[j][r]);
        }
      }
    };
    for (int64_t g = 0; g < G + 2; ++g) {
      if (g < G) multiply(g);
      if (g >= 1 && g <= G) store(g - 1);
      if (g >= 2) finish(g - 2);
    }
    for (int j = 0; j < nb; ++j)
      for (int64_t r = 0; r < R; ++r) _mm512_storeu_ps(y + (r0 + r) * ldy + j * kTokens, acc[j][r]);
  }
}

// tmm0-1, 4-5: the sums [16 rows, 16 tokens] int32 of two groups (by parity) of two blocks; tmm2:
// the rows' bytes of a group [16, 32]; tmm3, tmm6: the two blocks' lines of that group [8, 64].
void configure_head_tiles() {
  oilbird::amx::TileConfig cfg;
  for (int t : {0, 1, 4, 5}) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  cfg.rows[2] = 16, cfg.colsb[2] = kGroup;
  for (int t : {3, 6}) cfg.rows[t] = kGroup / 4, cfg.colsb[t] = kLineBytes;
  oilbird::amx::load_config(cfg);
}
#endif

}  // namespace
#endif

bool int8_head_tiles_available() {
#if defined(OILBIRD_AMX_HEAD)
  return oilbird::amx::tiles_granted();
#else
  return false;
#endif
}

// x [N, K] float32, packed [V/16, K/32, 576] (pack_int8_head) -> (u [N, V] approximate logits,
// bracket [N]: ||x - x^|| + gamma ||x^|| per row, rounded up; NaN for a row with non-finite inputs).
// `kernel`: "vnni" (AVX512-VNNI dot products) or "tiles" (AMX int8, `int8_head_tiles_available`):
// u has the same bits on either; which is the faster depends on the rows (oilbird/int8_head.py).
std::tuple<torch::Tensor, torch::Tensor> int8_head_logits(const torch::Tensor& x, const torch::Tensor& packed,
                                                          const std::string& kernel) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32, "int8_head_logits: x must be float32 [N, K]");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kGroupBytes && packed.scalar_type() == torch::kUInt8 &&
                  packed.is_contiguous(),
              "int8_head_logits: a weight packed by pack_int8_head");
  TORCH_CHECK(kernel == "vnni" || kernel == "tiles",
              "int8_head_logits: unknown kernel '", kernel, "' (vnni or tiles)");
  TORCH_CHECK(kernel != "tiles" || int8_head_tiles_available(),
              "int8_head_logits: AMX int8 tiles are not built here or the OS did not grant them");
  const int64_t N = x.size(0), K = x.size(1), G = packed.size(1), blocks = packed.size(0), V = blocks * kTokens;
  TORCH_CHECK(K == G * kGroup, "int8_head_logits: x has ", K, " features, the head ", G * kGroup);
  auto u = torch::empty({N, V}, x.options());
  auto bracket = torch::empty({N}, x.options());
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
  const bool tiles = kernel == "tiles";
  const auto rows = x.contiguous();
  // The tiles read 16 rows at a time: rows past N are zero bytes (their sums are never finished).
  auto a = torch::zeros({tiles ? (N + 15) / 16 * 16 : N, K}, x.options().dtype(torch::kInt8));
  auto s = torch::empty({N, G}, x.options());
  auto corr = torch::empty({N, G}, x.options().dtype(torch::kInt32));
  const float* px = rows.data_ptr<float>();
  int8_t* pa = a.data_ptr<int8_t>();
  float *ps = s.data_ptr<float>(), *pb = bracket.data_ptr<float>(), *pu = u.data_ptr<float>();
  int32_t* pc = corr.data_ptr<int32_t>();
  for (int64_t n = 0; n < N; ++n) pb[n] = quantize_row(px + n * K, K, pa + n * K, ps + n * G, pc + n * G);
  const uint8_t* pw = packed.data_ptr<uint8_t>();
#if defined(OILBIRD_AMX_HEAD)
  if (tiles) {
    at::parallel_for(0, (blocks + 1) / 2, 8, [&](int64_t t0, int64_t t1) {
      configure_head_tiles();  // per thread: the configuration is a thread's state
      for (int64_t t = t0; t < t1; ++t) {
        const uint8_t* w = pw + 2 * t * G * kGroupBytes;
        if (2 * t + 1 < blocks) block_tiles<true>(w, pa, ps, pc, N, K, G, pu + 2 * t * kTokens, V);
        else block_tiles<false>(w, pa, ps, pc, N, K, G, pu + 2 * t * kTokens, V);
      }
      _tile_release();
    });
    return {u, bracket};
  }
#endif
  // Rows in passes of equal size (9 rows: 5 and 4, not 8 and 1): a pass of one or two rows is
  // bound by its dot products' latency, not their throughput. A row's sums do not depend on its pass.
  const int64_t passes = (N + kMaxRows - 1) / kMaxRows;
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t p = 0, r0 = 0; p < passes; ++p) {
        const int64_t R = N / passes + (p < N % passes);
        kBlockRows[R - 1](pw + b * G * kGroupBytes, pa + r0 * K, ps + r0 * G, pc + r0 * G, K, G,
                          pu + r0 * V + b * kTokens, V);
        r0 += R;
      }
  });
#else
  TORCH_CHECK(false, "int8_head_logits: built without AVX512-VNNI");
#endif
  return {u, bracket};
}
