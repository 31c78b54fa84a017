// GEMM over GGUF blocks on AMX bfloat16 tiles: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), the weights
// in the layouts of block_layouts.h (as pack_q4 / pack_q8 wrote them), for CPUs with AMX-BF16.
//
// Why: the FMA kernel (q4_gemm.cpp) runs one FMA per weight and row, so past a few rows a forward
// costs what its FMAs cost; the int8 kernel (amx_blocks.cpp) moved the products onto tiles but
// has to finish four int32 part sums per row, group and output in float32, which cost about what
// the FMAs did. Here the tile multiply itself adds the parts (what it bought is at the end): each row's inputs are written as
// three bfloat16 parts, x = x1 + x2 + x3 exactly (8 significant bits each, 24 in all: float32's),
// q - c is a small integer, exact in bfloat16, so every product x_p (q - c) is exact in float32
// and one TDPBF16PS chain sums the three parts' products of a group into one float32 tile. A
// group's finish is then two FMAs per row and 16 outputs: y += d S + (m + c d) sum_k x_k, where
// S = sum_k x_k (q_k - c) over the group's inputs.
//
// Bits: the tile sums each row from that row's inputs only, in an order that does not depend on
// the other rows, and the finish is per row, so a row's result is the same bits at any row count
// (one path for every M, no separate one-row code): a tree forward gives each node a one-token
// step's bits (tests/test_amx_bf16_blocks.py). They are not the FMA kernel's bits (the sums are
// rounded in another order), as oneDNN's and the int8 kernel's are not.
//
// q is centred (c = 8 for 4-bit, 16 for 5-bit, the caller's `center` for bytes) so S and the
// offset term do not cancel. B tiles are made per group from the packed blocks: row p holds, for
// each of the 16 outputs, bf16(q[2p] - c) and bf16(q[2p + 1] - c) side by side (the pair layout
// TDPBF16PS reads), looked up in small tables for nibbles, converted for bytes.
//
// Paths: up to 16 rows one row tile and two blocks at a time; more rows (prefills, large trees)
// two row tiles by two blocks, each B tile made once per slab of 64 rows. What it bought, on two Xeon
// cores (docs/RESULTS.md, issue 15, stop 49): 0.54x the FMA kernel's time for a Q4_1 layer at 16
// rows but 1.56x at one row, where making the B tiles (three vpermd-class shuffles per 32 weights)
// and the tile multiplies (one per part, whatever the row count) do not overlap; SmolLM2's
// one-token forward 1.23x slower, its 16-node forward 0.85x: the flattest cost curve here, not the
// fastest decoding, so not the default (`ForwardConfig.block_kernel`).

#include <torch/types.h>  // not torch/extension.h: half the parse time; only skinny_gemm.cpp binds to Python
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "block_layouts.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define OILBIRD_AMX_BF16 1
#include "amx_bf16_pairs.h"
#include "amx_tiles.h"
#endif

namespace {

constexpr int64_t kB = oilbird::blocks::kOutputs;  // outputs per block: one tile's 16 columns
constexpr int kParts = 3;                          // bfloat16 parts of each input: 3 hold a float32 exactly
constexpr int64_t kLag = 2;                        // groups between a group's multiplies and its finish
constexpr int64_t kRing = kLag + 2;                // buffers for the groups in flight (made, multiplied, stored)

#if defined(OILBIRD_AMX_BF16)

namespace ob = oilbird::blocks;
using ob::made_bytes;
using ob::PairRows;

// Each row's inputs as three bfloat16 parts and each group's input sum [rows][groups]; `rows` is M
// rounded up to 16 when M > 16 (the padding zeros: a zero row changes no other row's sums). The
// parts are stored tile by tile, [part][row tile][group][16 rows][G], so each A tile a multiply
// reads is one contiguous run of 16 x G values (row-major, a tile's 16 rows lay 2K bytes apart,
// which ran slower; docs/RESULTS.md, issue 15, stop 51).
struct Split {
  std::vector<uint16_t> parts;  // with 32 values of slack: the tiles start at `base`, on a cache line
  std::vector<float> sums;
  int64_t M, rows, K, groups, G;
  uint16_t* base() {  // a tile row split over two cache lines costs two loads
    return reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(parts.data()) + 63) & ~uintptr_t{63});
  }
  uint16_t* at(int p, int64_t m, int64_t k) {
    return base() + ((p * tiles() + m / 16) * groups + k / G) * (16 * G) + (m % 16) * G + k % G;
  }
  // The A tile of part p for rows m.. (m a multiple of 16) and the group holding input k: rows 2G bytes apart.
  const uint16_t* part(int p, int64_t m, int64_t k) const { return const_cast<Split*>(this)->at(p, m, k); }
  int64_t tiles() const { return (rows + 15) / 16; }
  float sum(int64_t m, int64_t g) const { return sums[m * groups + g]; }
};

inline __m512 widen(__m256bh h) {  // bfloat16 -> float32, exact
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(reinterpret_cast<__m256i&>(h)), 16));
}

// x1 = bf16(x), x2 = bf16(x - x1), x3 = bf16(x - x1 - x2): each residual is exact in float32, and
// with round-to-nearest each part takes 8 of x's 24 significant bits, so x1 + x2 + x3 == x.
Split split_rows(const float* x, int64_t M, int64_t K, int64_t G) {
  const int64_t rows = M > 16 ? (M + 15) / 16 * 16 : M;
  Split s{std::vector<uint16_t>(kParts * ((rows + 15) / 16 * 16) * K + 32), std::vector<float>(rows * (K / G)), M, rows, K,
          K / G, G};
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m)
      for (int64_t g = 0; g < s.groups; ++g) {
        __m512 total = _mm512_setzero_ps();
        for (int64_t k = g * G; k < (g + 1) * G; k += 16) {
          const __m512 v = _mm512_loadu_ps(x + m * K + k);
          total = _mm512_add_ps(total, v);
          const __m256bh p1 = _mm512_cvtneps_pbh(v);
          const __m512 r1 = _mm512_sub_ps(v, widen(p1));
          const __m256bh p2 = _mm512_cvtneps_pbh(r1);
          const __m256bh p3 = _mm512_cvtneps_pbh(_mm512_sub_ps(r1, widen(p2)));
          std::memcpy(s.at(0, m, k), &p1, 32);
          std::memcpy(s.at(1, m, k), &p2, 32);
          std::memcpy(s.at(2, m, k), &p3, 32);
        }
        s.sums[m * s.groups + g] = _mm512_reduce_add_ps(total);
      }
  });
  return s;
}

// acc[r] = fma(S[r], d, acc[r]); acc[r] = fma(sum_r, m + c d, acc[r]) for `count` rows from m0 of
// one block; `scales` is the group's d[16] and m + c d [16]. The same two roundings for every row
// whatever the row count.
inline void finish(float* acc, const float* tile_sums, const float* scales, const Split& s, int64_t m0,
                   int64_t count, int64_t g) {
  const __m512 d = _mm512_load_ps(scales), offset = _mm512_load_ps(scales + 16);
  for (int64_t r = 0; r < count; ++r) {
    __m512 a = _mm512_fmadd_ps(_mm512_load_ps(tile_sums + r * 16), d, _mm512_load_ps(acc + r * 16));
    a = _mm512_fmadd_ps(_mm512_set1_ps(s.sum(m0 + r, g)), offset, a);
    _mm512_store_ps(acc + r * 16, a);
  }
}

// `count` rows of one block's sums (+ bias, after the sum) into y.
inline void store_rows(const float* acc, float* y, int64_t N, int64_t m0, int64_t count, int64_t b, const float* bias) {
  for (int64_t r = 0; r < count; ++r) {
    __m512 a = _mm512_load_ps(acc + r * 16);
    if (bias) a = _mm512_add_ps(a, _mm512_loadu_ps(bias + b * kB));
    _mm512_storeu_ps(y + (m0 + r) * N + b * kB, a);
  }
}

// ---- Up to 16 rows: one row tile, two blocks at a time ----

// tmm0-1: two blocks' sums [M, 16] float32; tmm2, 3, 6: the three parts [M, G] bfloat16; tmm4-5:
// two blocks' pair rows [G/2, 16 pairs].
void configure_narrow(int64_t M, int64_t G) {
  oilbird::amx::TileConfig cfg;
  for (int t : {0, 1}) cfg.rows[t] = static_cast<uint8_t>(M), cfg.colsb[t] = 64;
  for (int t : {2, 3, 6}) cfg.rows[t] = static_cast<uint8_t>(M), cfg.colsb[t] = static_cast<uint16_t>(2 * G);
  for (int t : {4, 5}) cfg.rows[t] = static_cast<uint8_t>(G / 2), cfg.colsb[t] = 64;
  oilbird::amx::load_config(cfg);
}

// One group's multiplies for every row and two blocks (tile numbers are immediates: unrolled):
// the parts in order, largest first, into one float32 sum per block, the blocks interleaved.
template <bool kTwo>
inline void multiply_narrow(const Split& s, int64_t k, const uint8_t* b0, const uint8_t* b1) {
  const int64_t stride = 2 * s.G;  // a tile's rows, contiguous
  _tile_zero(0);
  _tile_loadd(4, b0, 64);
  if constexpr (kTwo) {
    _tile_zero(1);
    _tile_loadd(5, b1, 64);
  }
  _tile_loadd(2, s.part(0, 0, k), stride);
  _tile_loadd(3, s.part(1, 0, k), stride);
  _tile_loadd(6, s.part(2, 0, k), stride);
  _tile_dpbf16ps(0, 2, 4);
  if constexpr (kTwo) _tile_dpbf16ps(1, 2, 5);
  _tile_dpbf16ps(0, 3, 4);
  if constexpr (kTwo) _tile_dpbf16ps(1, 3, 5);
  _tile_dpbf16ps(0, 6, 4);
  if constexpr (kTwo) _tile_dpbf16ps(1, 6, 5);
}

// Blocks b and b + 1 (or b alone), every row. The three jobs of a group are staggered so that none
// waits on the memory another just wrote: group g's multiplies are issued, then group g + 1's B
// tiles made (`slots`, a ring of kRing per block), then group g - 2's sums finished (a ring of
// kRing), which measured a little faster at one row than one group apart each.
template <typename L, bool kTwo>
void narrow_pair(const Split& s, const uint8_t* wp, float* y, int64_t N, int64_t b, const float* bias,
                 const PairRows<L>& pairs, int center, uint8_t* slots) {
  constexpr int64_t G = L::kInputs, kTile = G / 2 * 64, nb = kTwo ? 2 : 1, kMade = made_bytes(G);
  const int64_t groups = s.groups;
  auto slot = [&](int64_t j, int64_t g) { return slots + (kRing * j + g % kRing) * kMade; };
  auto make = [&](int64_t g) {
    for (int64_t j = 0; j < nb; ++j) ob::make_group<L>(pairs, wp + ((b + j) * groups + g) * L::kBytes, slot(j, g), center);
  };
  alignas(64) float acc[2][16 * 16] = {}, tile_sums[kRing][2][16 * 16];  // [block][row, output]; [group % kRing][block]
  make(0);
  for (int64_t g = 0; g < groups + kLag; ++g) {
    if (g < groups) multiply_narrow<kTwo>(s, g * G, slot(0, g), slot(nb - 1, g));
    if (g + 1 < groups) make(g + 1);
    if (g >= kLag)
      for (int64_t j = 0; j < nb; ++j)
        finish(acc[j], tile_sums[(g - kLag) % kRing][j], reinterpret_cast<const float*>(slot(j, g - kLag) + kTile), s, 0,
               s.M, g - kLag);
    if (g < groups) {
      _tile_stored(0, tile_sums[g % kRing][0], 64);
      if constexpr (kTwo) _tile_stored(1, tile_sums[g % kRing][1], 64);
    }
  }
  for (int64_t j = 0; j < nb; ++j) store_rows(acc[j], y, N, 0, s.M, b + j, bias);
}

template <typename L>
void gemm_narrow(const Split& s, const uint8_t* wp, float* y, int64_t N, const float* bias, int center) {
  const PairRows<L> pairs(center);
  const int64_t blocks = N / kB;
  at::parallel_for(0, (blocks + 1) / 2, 1, [&](int64_t t0, int64_t t1) {
    alignas(64) uint8_t slots[2 * kRing * made_bytes(L::kInputs)];
    configure_narrow(s.M, L::kInputs);
    for (int64_t t = t0; t < t1; ++t) {
      if (2 * t + 1 < blocks)
        narrow_pair<L, true>(s, wp, y, N, 2 * t, bias, pairs, center, slots);
      else
        narrow_pair<L, false>(s, wp, y, N, 2 * t, bias, pairs, center, slots);
    }
    _tile_release();
  });
}

// Rows in slabs of kSlab: a slab's parts, sums and outputs stay in the cores' L2 while its blocks
// go by (a 512-row prefill's parts and outputs alone are 5 MB for SmolLM2's MLP; in slabs its
// rows ran a few percent faster each, in a scratch A/B of this stop, 50). A row's bits do not
// depend on its slab: the paths give every row the same operations.
constexpr int64_t kSlab = 64;

// ---- More rows (prefills): two row tiles by two blocks, each tile loaded once for two multiplies ----

// tmm0-3: sums [16, 16] float32 of (row tile, block) (0, 0), (0, 1), (1, 0), (1, 1); tmm4-5: one
// part of the two row tiles [16, G]; tmm6-7: the two blocks' pair rows [G/2, 16 pairs].
void configure_wide(int64_t G) {
  oilbird::amx::TileConfig cfg;
  for (int t = 0; t < 4; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  for (int t : {4, 5}) cfg.rows[t] = 16, cfg.colsb[t] = static_cast<uint16_t>(2 * G);
  for (int t : {6, 7}) cfg.rows[t] = static_cast<uint8_t>(G / 2), cfg.colsb[t] = 64;
  oilbird::amx::load_config(cfg);
}

// One group's multiplies: each part of rows m0.. (and m0 + 16.. when `rows2`) times blocks b0 (and
// b1 when `blocks2`): four independent sums, the parts in order, largest first. (The tile
// intrinsics paste their register numbers into the assembly: literals only.)
inline void multiply_wide(const Split& s, int64_t m0, int64_t k, const uint8_t* b0, const uint8_t* b1, bool rows2,
                          bool blocks2) {
  const int64_t stride = 2 * s.G;  // a tile's rows, contiguous
  _tile_loadd(6, b0, 64);
  if (blocks2) _tile_loadd(7, b1, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int p = 0; p < kParts; ++p) {
    _tile_loadd(4, s.part(p, m0, k), stride);
    if (rows2) _tile_loadd(5, s.part(p, m0 + 16, k), stride);
    _tile_dpbf16ps(0, 4, 6);
    if (blocks2) _tile_dpbf16ps(1, 4, 7);
    if (rows2) _tile_dpbf16ps(2, 5, 6);
    if (rows2 && blocks2) _tile_dpbf16ps(3, 5, 7);
  }
}

// Every row of the slab (up to kSlab) for blocks b, b + 1 (or b). A batch is one group's
// multiplies for 32 rows (two row tiles) by the two blocks. Each group's B tiles are made once
// for the whole slab, while the group before's multiplies run, and each batch's sums are
// finished while the next batch's multiplies run, so the vector work (making, finishing) and the
// tile multiplies overlap. Slots are a ring of kRing per block: the group being made, the one
// multiplied and the one finished are never the same.
template <typename L>
void wide_blocks(const Split& s, const uint8_t* wp, float* y, int64_t N, int64_t b, bool blocks2, const float* bias,
                 const PairRows<L>& pairs, int center, uint8_t* slots) {
  constexpr int64_t G = L::kInputs, kTile = G / 2 * 64, kMade = made_bytes(G);
  const int64_t groups = s.groups, nb = blocks2 ? 2 : 1, row_pairs = (s.rows + 31) / 32;
  auto slot = [&](int64_t j, int64_t g) { return slots + (kRing * j + g % kRing) * kMade; };
  auto make = [&](int64_t g) {
    for (int64_t j = 0; j < nb; ++j) ob::make_group<L>(pairs, wp + ((b + j) * groups + g) * L::kBytes, slot(j, g), center);
  };
  auto rows2 = [&](int64_t rp) { return 32 * rp + 16 < s.rows; };
  auto used = [&](int64_t rp, int64_t t) { return (t & 1) < nb && (t < 2 || rows2(rp)); };  // t = row tile * 2 + block
  // acc: [row tile of the slab][block][row, output]; tile_sums: [batch parity][t][row, output]
  alignas(64) float acc[kSlab / 16][2][16 * 16] = {}, tile_sums[2][4][16 * 16];
  auto finish_batch = [&](int64_t i) {
    const int64_t g = i / row_pairs, rp = i % row_pairs;
    for (int64_t t = 0; t < 4; ++t)
      if (used(rp, t))
        finish(acc[2 * rp + (t >> 1)][t & 1], tile_sums[i & 1][t],
               reinterpret_cast<const float*>(slot(t & 1, g) + kTile), s, 32 * rp + 16 * (t >> 1), 16, g);
  };
  make(0);
  for (int64_t g = 0, i = 0; g < groups; ++g)
    for (int64_t rp = 0; rp < row_pairs; ++rp, ++i) {
      multiply_wide(s, 32 * rp, g * G, slot(0, g), slot(nb - 1, g), rows2(rp), blocks2);
      if (rp == 0 && g + 1 < groups) make(g + 1);
      if (i > 0) finish_batch(i - 1);
      _tile_stored(0, tile_sums[i & 1][0], 64);
      if (blocks2) _tile_stored(1, tile_sums[i & 1][1], 64);
      if (rows2(rp)) _tile_stored(2, tile_sums[i & 1][2], 64);
      if (rows2(rp) && blocks2) _tile_stored(3, tile_sums[i & 1][3], 64);
    }
  finish_batch(groups * row_pairs - 1);
  for (int64_t r = 0; r < s.rows / 16; ++r)
    for (int64_t j = 0; j < nb; ++j)
      store_rows(acc[r][j], y, N, 16 * r, std::clamp<int64_t>(s.M - 16 * r, 0, 16), b + j, bias);
}

// Each thread takes a range of block pairs and runs each over the slab's rows; the slab's parts
// (kSlab rows) stay in its core's cache while its blocks go by.
template <typename L>
void gemm_wide(const Split& s, const uint8_t* wp, float* y, int64_t N, const float* bias, int center) {
  const PairRows<L> pairs(center);
  const int64_t blocks = N / kB;
  at::parallel_for(0, (blocks + 1) / 2, 1, [&](int64_t t0, int64_t t1) {
    alignas(64) uint8_t slots[2 * kRing * made_bytes(L::kInputs)];
    configure_wide(L::kInputs);
    for (int64_t t = t0; t < t1; ++t) wide_blocks<L>(s, wp, y, N, 2 * t, 2 * t + 1 < blocks, bias, pairs, center, slots);
    _tile_release();
  });
}

template <typename L>
void bf16_gemm(const float* x, const uint8_t* wp, float* y, int64_t M, int64_t K, int64_t N, const float* bias,
               int center) {
  for (int64_t m0 = 0; m0 < M; m0 += kSlab) {
    const int64_t rows = std::min(kSlab, M - m0);
    const Split s = split_rows(x + m0 * K, rows, K, L::kInputs);
    if (rows <= 16)
      gemm_narrow<L>(s, wp, y + m0 * N, N, bias, center);
    else
      gemm_wide<L>(s, wp, y + m0 * N, N, bias, center);
  }
}

#endif  // OILBIRD_AMX_BF16

}  // namespace

bool amx_bf16_available() {
#if defined(OILBIRD_AMX_BF16)
  return oilbird::amx::tiles_granted();
#else
  return false;
#endif
}

// x [..., K] float32, packed by pack_q4 (320 or 384 bytes a group: 4 or 5 bits, centred by 8 or 16)
// or pack_q8 (`bytes` true, centred by `center`), bias [N] or None -> y [..., N] float32.
torch::Tensor linear_amx_bf16(const torch::Tensor& x, const torch::Tensor& packed,
                              const c10::optional<torch::Tensor>& bias, bool bytes, int64_t center) {
  TORCH_CHECK(amx_bf16_available(), "linear_amx_bf16: AMX-BF16 is not built here or the OS did not grant its tiles");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == torch::kUInt8 && packed.is_contiguous() &&
                  (bytes ? packed.size(2) == 384 : (packed.size(2) == 320 || packed.size(2) == 384)),
              "linear_amx_bf16: a weight packed by pack_q4 or pack_q8");
  TORCH_CHECK(center >= 0 && center <= 128, "linear_amx_bf16: center must be in 0..128");
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == torch::kFloat32, "linear_amx_bf16: x must be a float32 tensor [..., K]");
  const int64_t G = bytes ? 16 : 32, K = packed.size(1) * G, N = packed.size(0) * kB;
  TORCH_CHECK(x.size(-1) == K, "linear_amx_bf16: x has ", x.size(-1), " features, the weight ", K);
  TORCH_CHECK(!bias.has_value() || (bias->scalar_type() == torch::kFloat32 && bias->numel() == N && bias->is_contiguous()),
              "linear_amx_bf16: bias must be a contiguous float32 [N]");
  const auto rows = x.reshape({-1, K}).contiguous();  // [M, K]
  auto out_shape = x.sizes().vec();
  out_shape.back() = N;
  auto y = torch::empty(out_shape, x.options());  // [..., N]
#if defined(OILBIRD_AMX_BF16)
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  const int64_t M = rows.size(0);
  const float* xp = rows.data_ptr<float>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  float* yp = y.data_ptr<float>();
  if (M > 0) {
    if (bytes)
      bf16_gemm<ob::Bytes>(xp, wp, yp, M, K, N, b, static_cast<int>(center));
    else if (packed.size(2) == 384)  // Q5_0: q - 16
      bf16_gemm<ob::FiveBits>(xp, wp, yp, M, K, N, b, 16);
    else  // 4-bit: q - 8
      bf16_gemm<ob::Nibbles>(xp, wp, yp, M, K, N, b, 8);
  }
#endif
  return y;
}
