// Tree attention with query rows in vector lanes (float32), exact up to rounding.
//
// With 16 *keys* in a register's lanes (online softmax, this kernel's predecessor), every block
// of 16 keys costs each query row two horizontal reductions (max and sum), a rescale of its
// running output, and the keys must be packed per call. Here the lanes hold 16 query *rows*
// (flattened over a key/value head's group of query heads and the tree's nodes, as in the other
// kernels), so the softmax is vertical: one running maximum and one sum per lane, no reductions
// across lanes, no packing. Per tile of up to 16 rows (8 on AVX2):
//
//   1. scores  s[j] = q^T . k_j (+ mask)  16 keys at a time: 16 accumulators, each FMA a row
//                                          vector of q^T[d] times key j's d-th value broadcast;
//                                          keys read as cache rows; the mask added only on the
//                                          keys some row cannot see (the tree's own columns)
//   2. softmax p[j] = exp(s[j] - max_j s), l = sum_j p[j]          (lane-wise, [S][16] in L1/L2)
//   3. output  o[d] = sum_j p[j] v_j[d] / l     16 dims per pass over the values, each FMA p[j]
//                                               times v_j[d] broadcast
//
// A tile costs the same whatever number of its lanes hold real rows, so the kernel suits trees
// whose group x nodes fills the lanes; the binding (tree_attention.cpp) hands fewer than 7 rows
// to the two-pass kernel. Both prefetch the cache's rows ahead of use: decoding reads each
// layer's cache cold from memory, a whole forward of weights after the last read.
//
// A causal forward (a prefill, perhaps over cached keys; no mask) gives lane r the keys
// [0, S - N + node + 1): a tile scores only the keys its farthest-seeing row may see, and masks
// per lane only those beyond what its nearest-seeing row may.
//
// Supported: head_dim a multiple of the lane count (64, 128), mask [N, S] additive float32
// (finfo.min or -inf where masked); every row must see at least one key (its own node does).

#pragma once

#include <torch/types.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "simd.h"
#include "tree_attention_problem.h"

namespace oilbird::lanes {

namespace v = oilbird::simd;
constexpr int L = v::kLanes;  // query rows per tile, and keys per block of scores

using Problem = oilbird::AttentionProblem;

// A tile's lanes: each one's tree node (its mask row) and the keys it may attend, [0, end).
struct Lanes {
  int64_t node[L], head[L], end[L];
  int64_t keys;  // keys the tile scores: the most any lane attends
  int64_t open;  // keys [0, open) every lane attends with mask 0
};

// Step 1 for one block of n <= L keys from j0: scores into s + j0 * L (one vector per key), the
// running lane-wise maximum in mx. `t` holds each lane's node (its mask row) and keys. RowStride is
// the keys' row stride when known at compile time (the cache's rows are contiguous: D), so that
// each FMA addresses its key as base + constant instead of holding 16 key pointers; 0: p.k_row.
template <int64_t RowStride>
inline void score_block(const Problem& p, const float* qt, const float* kh, const Lanes& t, int64_t j0,
                        int64_t n, float* s, v::vf& mx) {
  const int64_t stride = RowStride ? RowStride : p.k_row;
  v::vf acc[L];
  for (int c = 0; c < L; ++c) acc[c] = v::zero();
  if (n == L) {
    const float* kb = kh + j0 * stride;
    // Contiguous rows: the next block's keys are the D lines after this block's; one prefetch per
    // step brings them in while this block computes (the cache's rows come cold from memory).
    const bool ahead = RowStride == p.D && j0 + 2 * L <= t.keys;
    for (int64_t d = 0; d < p.D; ++d) {
      if (ahead) _mm_prefetch(reinterpret_cast<const char*>(kb + L * stride + d * 16), _MM_HINT_T0);
      const v::vf qv = v::load(qt + d * L);
      for (int c = 0; c < L; ++c) acc[c] = v::fmadd(qv, v::set1(kb[c * stride + d]), acc[c]);
    }
  } else {  // the last, partial block
    for (int64_t d = 0; d < p.D; ++d) {
      const v::vf qv = v::load(qt + d * L);
      for (int64_t c = 0; c < n; ++c) acc[c] = v::fmadd(qv, v::set1(kh[(j0 + c) * stride + d]), acc[c]);
    }
  }
  for (int64_t c = 0; c < n; ++c) {
    const int64_t j = j0 + c;
    v::vf x = acc[c];
    if (j >= t.open) {
      constexpr float kNegInf = -std::numeric_limits<float>::infinity();
      alignas(64) float add[L];
      for (int r = 0; r < L; ++r) add[r] = p.causal ? (j < t.end[r] ? 0.0f : kNegInf) : p.mask[t.node[r] * p.S + j];
      x = v::add(x, v::load(add));
    }
    v::store(s + j * L, x);
    mx = v::max(mx, x);
  }
}

// Rows [row, row + rows) (rows <= L) of key/value head h; `s` holds S x L scores.
inline void tile(const Problem& p, int64_t h, int64_t row, int64_t rows, float* s) {
  const int64_t D = p.D;
  alignas(64) float qt[128 * L];  // [D][L]: the rows' queries, transposed
  alignas(64) float ot[128 * L];  // [D][L]: their outputs
  Lanes t;
  t.keys = 0, t.open = p.S;
  for (int r = 0; r < L; ++r) {
    const int64_t i = row + std::min<int64_t>(r, rows - 1);  // spare lanes repeat the last row
    t.head[r] = h * p.G + i / p.N;
    t.node[r] = i % p.N;
    t.end[r] = p.causal ? p.S - p.N + t.node[r] + 1 : p.S;
    t.keys = std::max(t.keys, t.end[r]);
    t.open = std::min(t.open, t.end[r]);
    const float* src = p.q + (h * p.G * p.N + i) * D;
    for (int64_t d = 0; d < D; ++d) qt[d * L + r] = src[d];
  }
  if (!p.causal) t.open = p.open;
  const int64_t S = t.keys;
  const float* kh = p.k + h * p.k_head;
  v::vf mx = v::set1(-std::numeric_limits<float>::infinity());
  for (int64_t j0 = 0; j0 < S; j0 += L) {
    const int64_t n = std::min<int64_t>(L, S - j0);
    if (p.k_row == 64) score_block<64>(p, qt, kh, t, j0, n, s, mx);
    else if (p.k_row == 128) score_block<128>(p, qt, kh, t, j0, n, s, mx);
    else score_block<0>(p, qt, kh, t, j0, n, s, mx);
  }
  v::vf l = v::zero();
  for (int64_t j = 0; j < S; ++j) {
    const v::vf e = v::exp(v::sub(v::load(s + j * L), mx));
    v::store(s + j * L, e);
    l = v::add(l, e);
  }
  const v::vf inv = v::div(v::set1(1.0f), l);
  const float* vh = p.v + h * p.v_head;
  for (int64_t d0 = 0; d0 < D; d0 += L) {
    v::vf o[L];
    for (int c = 0; c < L; ++c) o[c] = v::zero();
    const float* vr = vh + d0;
    for (int64_t j = 0; j < S; ++j, vr += D) {
      // This pass reads one line of each value row: fetch the line 32 rows ahead.
      if (j + 32 < S) _mm_prefetch(reinterpret_cast<const char*>(vr + 32 * D), _MM_HINT_T0);
      const v::vf pj = v::load(s + j * L);
      for (int c = 0; c < L; ++c) o[c] = v::fmadd(pj, v::set1(vr[c]), o[c]);
    }
    for (int c = 0; c < L; ++c) v::store(ot + (d0 + c) * L, v::mul(o[c], inv));
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* dst = p.out + (t.node[r] * p.Hq + t.head[r]) * D;
    for (int64_t d = 0; d < D; ++d) dst[d] = ot[d * L + r];
  }
}

// The number of leading keys that no row of the [N, S] additive mask hides (mask exactly 0).
inline int64_t open_keys(const float* mask, int64_t N, int64_t S) {
  int64_t open = S;
  const v::vf zero = v::zero();
  for (int64_t n = 0; n < N && open > 0; ++n) {
    const float* row = mask + n * S;
    int64_t j = 0;
    for (; j + L <= open; j += L) {  // L at a time while every lane is 0
      const v::vf x = v::load(row + j);
      if (v::greater_bits(x, zero) | v::greater_bits(zero, x)) break;
    }
    while (j < open && row[j] == 0.0f) ++j;
    open = j;
  }
  return open;
}

// queries [Hq, N, D] scaled and contiguous, k and v [1, Hkv, S, D], m [N, S] or, when causal, none
// -> [1, N, Hq, D].
inline torch::Tensor run(const torch::Tensor& queries, const torch::Tensor& k, const torch::Tensor& v,
                         const c10::optional<torch::Tensor>& m, bool causal) {
  const int64_t Hq = queries.size(0), N = queries.size(1), D = queries.size(2);
  const int64_t Hkv = k.size(1), S = k.size(2), G = Hq / Hkv, rows = G * N;
  TORCH_CHECK(D % L == 0 && D <= 128, "tree_attention (lanes): head_dim must be a multiple of ", L, " up to 128");
  auto out = torch::empty({1, N, Hq, D}, queries.options());
  const float* mask = causal ? nullptr : m->data_ptr<float>();
  const Problem p{queries.data_ptr<float>(), k.data_ptr<float>(), k.stride(1), k.stride(2),
                  v.data_ptr<float>(), v.stride(1), mask, out.data_ptr<float>(), Hq, G, N, S, D,
                  causal, causal ? S - N + 1 : open_keys(mask, N, S)};
  const int64_t tiles = (rows + L - 1) / L, count = Hkv * tiles;
  at::parallel_for(0, count, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> s(S * L);  // [S][L] scores, then probabilities
    for (int64_t n = t0; n < t1; ++n) {
      // Causal tiles cost more the later their nodes: take them from both ends in turn, so that
      // each thread's contiguous share of n holds cheap and dear tiles alike.
      const int64_t i = !causal ? n : n % 2 == 0 ? n / 2 : count - 1 - n / 2;
      const int64_t h = i / tiles, row = (i % tiles) * L;
      tile(p, h, row, std::min<int64_t>(L, rows - row), s.data());
    }
  });
  return out;
}

}  // namespace oilbird::lanes
