// Tree attention with online softmax, for AVX-512 builds (float32), exact up to rounding.
//
// A tree forward attends N tree nodes over S = cached + N keys under the tree mask. PyTorch's CPU
// SDPA kernel runs its small matrix products through MKL, which on this project's AMD CPU takes a
// slow generic path: at 64 nodes attention was a quarter of SmolLM2's forward (docs/RESULTS.md,
// issue 15). This kernel is one pass of online-softmax ("flash") attention per tile of R query
// rows (up to 8), so each key and value is read once per R rows; scores stay in registers and the
// running outputs o in a small L1 buffer, updated a few registers at a time:
//
//   for each block of 16 keys:  s = q K_blk^T + mask            (R x 16 scores, FMAs over D)
//                               m' = max(m, max s); p = exp(s - m')
//                               l = l e^(m - m') + sum p;  o = o e^(m - m') + p V_blk
//   out = o / l
//
// Grouped-query attention without copies: every query head of a key/value head's group reads
// that head's keys and values in place (rows of the cache, any head stride). Keys are packed per
// call into [S/16][D][16] so that 16 keys' scores come from D broadcast FMAs; values are read as
// cache rows. exp is simd::exp (a degree-7 polynomial, ~1e-7 relative).
//
// Supported: head_dim 64 or 128, mask [N, S] additive float32 (finfo.min or -inf where masked).

#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "simd.h"

namespace oilbird::online {

namespace v = oilbird::simd;
constexpr int64_t kKeys = 16;  // keys per block: one AVX-512 register of scores or two AVX2 ones

struct Problem {
  const float* q;      // [Hq, N, D] scaled queries, contiguous
  const float* keys;   // [Hkv][S16/16][D][16] packed keys
  const float* v;      // values: row s of head h at v + h * v_head + s * D
  int64_t v_head;
  const float* mask;   // [N, S]
  float* out;          // [N, Hq, D]
  int64_t Hq, G, N, S, D;
};

// Output registers per pass over a block's values: R rows x kChunk registers of the head dim.
constexpr int kChunk = 2;
constexpr int kScoreRegs = kKeys / v::kLanes;  // registers of scores per row: 1 (AVX-512) or 2 (AVX2)
// Rows per tile: each key block and value row is read once for R rows (R x kScoreRegs score
// registers and R x kChunk output registers within the accumulator budget).
constexpr int kRows = std::min(8, v::kAccumulators / std::max(kScoreRegs, kChunk));

// Scores of R rows against one block of kKeys packed keys: s[r][c] = q_r . K_blk (lanes c).
template <int R>
inline void scores(const float* const* qrow, const float* kblk, int64_t D, v::vf (&s)[R][kScoreRegs]) {
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kScoreRegs; ++c) s[r][c] = v::zero();
  for (int64_t d = 0; d < D; ++d) {
    v::vf w[kScoreRegs];
    for (int c = 0; c < kScoreRegs; ++c) w[c] = v::load(kblk + d * kKeys + c * v::kLanes);
    for (int r = 0; r < R; ++r) {
      const v::vf x = v::set1(qrow[r][d]);
      for (int c = 0; c < kScoreRegs; ++c) s[r][c] = v::fmadd(x, w[c], s[r][c]);
    }
  }
}

// R query rows (flattened over the group's heads and nodes, from `row`) of key/value head h. The
// running outputs live in a small L1 buffer `acc` [R][D], updated kChunk registers at a time.
template <int R>
void tile(const Problem& p, int64_t h, int64_t row, int64_t rows) {
  const int64_t D = p.D, blocks = (p.S + kKeys - 1) / kKeys;
  const float* qrow[R];
  const float* mrow[R];
  for (int r = 0; r < R; ++r) {
    const int64_t i = row + std::min<int64_t>(r, rows - 1);  // spare lanes repeat the last row
    qrow[r] = p.q + (h * p.G * p.N + i) * D;
    mrow[r] = p.mask + (i % p.N) * p.S;
  }
  alignas(64) float acc[R][128] = {};
  alignas(64) float probs[R][kKeys];
  float m[R], l[R], alpha[R];
  for (int r = 0; r < R; ++r) m[r] = -std::numeric_limits<float>::infinity(), l[r] = 0.0f;
  const float* kh = p.keys + h * blocks * D * kKeys;
  const float* vh = p.v + h * p.v_head;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t kb = 0; kb < blocks; ++kb) {
    const int64_t first = kb * kKeys, valid = std::min<int64_t>(kKeys, p.S - first);
    v::vf s[R][kScoreRegs];
    scores<R>(qrow, kh + kb * D * kKeys, D, s);
    for (int r = 0; r < R; ++r) {
      float mx = m[r];
      for (int c = 0; c < kScoreRegs; ++c) {
        // Padded keys (past S) are zeros; their mask lanes are -inf, so they weigh nothing.
        const int64_t at = first + c * v::kLanes, n = valid - c * v::kLanes;
        const v::vf add = n >= v::kLanes ? v::load(mrow[r] + at) : v::load_partial(mrow[r] + at, n, kNegInf);
        s[r][c] = v::add(s[r][c], add);
        mx = std::max(mx, v::reduce_max(s[r][c]));
      }
      float sum = 0.0f;
      for (int c = 0; c < kScoreRegs; ++c) {
        const v::vf e = v::exp(v::sub(s[r][c], v::set1(mx)));
        sum += v::reduce_add(e);
        v::store(probs[r] + c * v::kLanes, e);
      }
      alpha[r] = std::exp(m[r] - mx);  // 0 on the first block (m = -inf)
      l[r] = l[r] * alpha[r] + sum;
      m[r] = mx;
    }
    for (int64_t d0 = 0; d0 < D; d0 += kChunk * v::kLanes) {
      v::vf o[R][kChunk];
      for (int r = 0; r < R; ++r)
        for (int b = 0; b < kChunk; ++b) o[r][b] = v::mul(v::load(acc[r] + d0 + b * v::kLanes), v::set1(alpha[r]));
      for (int64_t j = 0; j < valid; ++j) {
        const float* vrow = vh + (first + j) * D + d0;
        for (int b = 0; b < kChunk; ++b) {
          const v::vf vv = v::load(vrow + b * v::kLanes);
          for (int r = 0; r < R; ++r) o[r][b] = v::fmadd(v::set1(probs[r][j]), vv, o[r][b]);
        }
      }
      for (int r = 0; r < R; ++r)
        for (int b = 0; b < kChunk; ++b) v::store(acc[r] + d0 + b * v::kLanes, o[r][b]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const int64_t i = row + r, head = h * p.G + i / p.N, node = i % p.N;
    float* dst = p.out + (node * p.Hq + head) * D;
    const v::vf inv = v::set1(1.0f / l[r]);
    for (int64_t d = 0; d < D; d += v::kLanes) v::store(dst + d, v::mul(v::load(acc[r] + d), inv));
  }
}

void attend(const Problem& p) {
  const int64_t rows = p.G * p.N, tiles = (rows + kRows - 1) / kRows;
  at::parallel_for(0, (p.Hq / p.G) * tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t / tiles, row = (t % tiles) * kRows;
      tile<kRows>(p, h, row, std::min<int64_t>(kRows, rows - row));
    }
  });
}

// Keys [1, Hkv, S, D] (any head and row stride) packed as [Hkv, Sp/16, D, 16], zero past S, so
// that 16 keys' scores come from D broadcast FMAs. One block of 16 keys per task, on ATen's
// threads: the copy is a sizeable share of a small forward's attention.
torch::Tensor pack_keys(const torch::Tensor& k, int64_t Sp) {
  const int64_t Hkv = k.size(1), S = k.size(2), D = k.size(3), blocks = Sp / kKeys;
  auto keys = torch::empty({Hkv, blocks, D, kKeys}, k.options());
  const float* src = k.data_ptr<float>();
  float* dst = keys.data_ptr<float>();
  const int64_t head_stride = k.stride(1), row_stride = k.stride(2);
  at::parallel_for(0, Hkv * blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t h = b / blocks, first = (b % blocks) * kKeys;
      float* out = dst + b * D * kKeys;
      for (int64_t j = 0; j < kKeys; ++j) {
        const float* row = src + h * head_stride + (first + j) * row_stride;
        if (first + j < S) {
          for (int64_t d = 0; d < D; ++d) out[d * kKeys + j] = row[d];
        } else {
          for (int64_t d = 0; d < D; ++d) out[d * kKeys + j] = 0.0f;
        }
      }
    }
  });
  return keys;
}

// queries [Hq, N, D] scaled and contiguous, k and v [1, Hkv, S, D], m [N, S] -> [1, N, Hq, D].
inline torch::Tensor run(const torch::Tensor& queries, const torch::Tensor& k, const torch::Tensor& v,
                         const torch::Tensor& m) {
  const int64_t Hq = queries.size(0), N = queries.size(1), D = queries.size(2);
  const int64_t Hkv = k.size(1), S = k.size(2);
  const int64_t Sp = (S + kKeys - 1) / kKeys * kKeys;  // S padded to whole blocks
  auto keys = pack_keys(k, Sp);  // [Hkv, Sp/16, D, 16]
  auto out = torch::empty({1, N, Hq, D}, queries.options());
  Problem p{queries.data_ptr<float>(), keys.data_ptr<float>(), v.data_ptr<float>(), v.stride(1),
            m.data_ptr<float>(), out.data_ptr<float>(), Hq, Hq / Hkv, N, S, D};
  attend(p);
  return out;
}

}  // namespace oilbird::online
