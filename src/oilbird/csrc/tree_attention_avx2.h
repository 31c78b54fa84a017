// Tree attention on AVX2 (256-bit registers), two passes per tile of query rows, exact up to rounding.
//
// Online softmax with keys in the lanes pays, on 8-lane registers, per-block bookkeeping (two
// horizontal max and sum reductions, a rescale of the running outputs and their round trip
// through L1 for every 16 keys) and a per-call packing of the keys that cost as much as the
// arithmetic. A tree forward's cache is short enough (S <= a few thousand) for a tile's scores to
// stay in L1/L2, so this kernel does plain softmax attention in three steps:
//
//   1. scores  s[r][j] = q_r . k_j + mask[r][j]   3 rows x 4 keys per step, keys read as cache rows
//                                                  (no packing); the 12 sums reduced across lanes
//                                                  by hadd at the end of each step
//   2. softmax p[r][j] = exp(s - max_r s), l_r = sum_j p[r][j]      (one max, one sum per row)
//   3. output  out_r = (sum_j p[r][j] v_j) / l_r  6 rows x 16 dims per pass over the values,
//                                                  accumulators in registers for all S keys
//
// Every query head of a key/value head's group reads that head's keys and values in place.
#pragma once

#include <immintrin.h>
#include <torch/types.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "simd.h"
#include "tree_attention_problem.h"

namespace oilbird::avx2 {

namespace v = oilbird::simd;

using Problem = oilbird::AttentionProblem;

// Four 8-lane partial sums -> their four totals, in one 128-bit register.
inline __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// Scores of R (<= 3) query rows against keys [j0, j1) (j1 - j0 a multiple of 4) into s[r] + j.
// `end`: the keys the tile scores in all (the prefetch stays below it).
template <int R>
inline void scores(const float* const* q, const float* k, int64_t k_row, int64_t D, int64_t j0, int64_t j1,
                   int64_t end, float* const* s) {
  for (int64_t j = j0; j < j1; j += 4) {
    __m256 acc[R][4];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_ps();
    const float* kj = k + j * k_row;
    // The cache's rows come cold from memory: fetch the keys 16 ahead.
    if (j + 20 <= end)
      for (int c = 0; c < 4; ++c)
        for (int64_t d = 0; d < D; d += 16) _mm_prefetch(reinterpret_cast<const char*>(kj + (16 + c) * k_row + d), _MM_HINT_T0);
    for (int64_t d = 0; d < D; d += 8) {
      __m256 kv[4];
      for (int c = 0; c < 4; ++c) kv[c] = _mm256_loadu_ps(kj + c * k_row + d);
      for (int r = 0; r < R; ++r) {
        const __m256 x = _mm256_loadu_ps(q[r] + d);
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_fmadd_ps(x, kv[c], acc[r][c]);
      }
    }
    for (int r = 0; r < R; ++r) _mm_storeu_ps(s[r] + j, reduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
  }
}

// One key's score for one row (the last S mod 4 keys). The 8-lane sum is reduced here, not by
// simd.h, whose vector is 16 lanes wide when the module is built for AVX-512.
inline float score1(const float* q, const float* k, int64_t D) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), acc);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// s[0, S) = exp(s - m) in place; returns their sum.
inline float exp_and_sum(float* s, int64_t S, float m) {
  const int64_t whole = S / v::kLanes * v::kLanes;
  const v::vf mv = v::set1(m);
  v::vf sum = v::zero();
  for (int64_t j = 0; j < whole; j += v::kLanes) {
    const v::vf e = v::exp(v::sub(v::load(s + j), mv));
    v::store(s + j, e);
    sum = v::add(sum, e);
  }
  float l = v::reduce_add(sum);
  for (int64_t j = whole; j < S; ++j) s[j] = std::exp(s[j] - m), l += s[j];
  return l;
}

// Step 2 for one row in place: s += mask; s = exp(s - max); returns the sum.
inline float softmax_row(float* s, const float* mask, int64_t S) {
  const int64_t whole = S / v::kLanes * v::kLanes;
  v::vf mx = v::set1(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < whole; j += v::kLanes) {
    const v::vf x = v::add(v::load(s + j), v::load(mask + j));
    v::store(s + j, x);
    mx = v::max(mx, x);
  }
  float m = v::reduce_max(mx);
  for (int64_t j = whole; j < S; ++j) s[j] += mask[j], m = std::max(m, s[j]);
  return exp_and_sum(s, S, m);
}

// Step 2 under the causal rule: softmax over s[0, valid), and s[valid, width) set to 0 (keys a
// row may not see, scored only because a row tile shares one key range).
inline float softmax_prefix(float* s, int64_t valid, int64_t width) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::fill(s + valid, s + width, kNegInf);  // exp(-inf - m) = 0 below
  const int64_t whole = width / v::kLanes * v::kLanes;
  v::vf mx = v::set1(kNegInf);
  for (int64_t j = 0; j < whole; j += v::kLanes) mx = v::max(mx, v::load(s + j));
  float m = v::reduce_max(mx);
  for (int64_t j = whole; j < width; ++j) m = std::max(m, s[j]);
  return exp_and_sum(s, width, m);
}

// Step 3 for R (<= 6) rows: o[r][d0:d0+16] = sum_j p[r][j] v_j[d0:d0+16] * inv[r].
template <int R>
inline void weighted_values(const float* const* p, const float* vh, int64_t D, int64_t S, const float* inv,
                            float* const* o) {
  for (int64_t d0 = 0; d0 < D; d0 += 16) {
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const float* vr = vh + d0;
    for (int64_t j = 0; j < S; ++j, vr += D) {
      // This pass reads one line of each value row: fetch the line 32 rows ahead.
      if (j + 32 < S) _mm_prefetch(reinterpret_cast<const char*>(vr + 32 * D), _MM_HINT_T0);
      const __m256 a = _mm256_loadu_ps(vr), b = _mm256_loadu_ps(vr + 8);
      for (int r = 0; r < R; ++r) {
        const __m256 w = _mm256_broadcast_ss(p[r] + j);
        acc[r][0] = _mm256_fmadd_ps(w, a, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(w, b, acc[r][1]);
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 s = _mm256_set1_ps(inv[r]);
      _mm256_storeu_ps(o[r] + d0, _mm256_mul_ps(acc[r][0], s));
      _mm256_storeu_ps(o[r] + d0 + 8, _mm256_mul_ps(acc[r][1], s));
    }
  }
}

constexpr int64_t kKeyBlock = 64;  // keys whose rows stay in L1 while every row triple reads them

// Rows [row, row + rows) of key/value head h (rows flattened over the group's heads and nodes);
// `buf` holds rows x S scores.
inline void tile(const Problem& p, int64_t h, int64_t row, int64_t rows, float* buf) {
  const int64_t D = p.D;
  const float* kh = p.k + h * p.k_head;
  const float* q[12];
  float* s[12];
  float* o[12];
  int64_t valid[12];  // keys row r may attend: all S, or under the causal rule S - N + node + 1
  int64_t S = 0;      // keys the tile scores: the most any of its rows attends
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row + r, node = i % p.N;
    valid[r] = p.causal ? p.S - p.N + node + 1 : p.S;
    S = std::max(S, valid[r]);
  }
  const int64_t S4 = S / 4 * 4;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = row + r, head = h * p.G + i / p.N, node = i % p.N;
    q[r] = p.q + (h * p.G * p.N + i) * D;
    s[r] = buf + r * S;
    o[r] = p.out + (node * p.Hq + head) * D;
  }
  for (int64_t j0 = 0; j0 < S4; j0 += kKeyBlock) {
    const int64_t j1 = std::min(S4, j0 + kKeyBlock);
    int64_t r = 0;
    for (; r + 3 <= rows; r += 3) scores<3>(q + r, kh, p.k_row, D, j0, j1, S4, s + r);
    if (rows - r == 2) scores<2>(q + r, kh, p.k_row, D, j0, j1, S4, s + r);
    if (rows - r == 1) scores<1>(q + r, kh, p.k_row, D, j0, j1, S4, s + r);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = S4; j < S; ++j) s[r][j] = score1(q[r], kh + j * p.k_row, D);
  float inv[12];
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t node = (row + r) % p.N;
    inv[r] = 1.0f / (p.causal ? softmax_prefix(s[r], valid[r], S) : softmax_row(s[r], p.mask + node * S, S));
  }
  const float* vh = p.v + h * p.v_head;
  int64_t r = 0;
  for (; r + 6 <= rows; r += 6) weighted_values<6>(s + r, vh, D, S, inv + r, o + r);
  switch (rows - r) {
    case 5: weighted_values<5>(s + r, vh, D, S, inv + r, o + r); break;
    case 4: weighted_values<4>(s + r, vh, D, S, inv + r, o + r); break;
    case 3: weighted_values<3>(s + r, vh, D, S, inv + r, o + r); break;
    case 2: weighted_values<2>(s + r, vh, D, S, inv + r, o + r); break;
    case 1: weighted_values<1>(s + r, vh, D, S, inv + r, o + r); break;
    default: break;
  }
}

// Rows per tile: up to 12 (four row triples share each block of keys), fewer when that leaves a
// thread idle.
inline int64_t tile_rows(int64_t rows, int64_t heads, int64_t threads) {
  int64_t t = 12;
  while (t > 3 && heads * ((rows + t - 1) / t) < 2 * threads) t -= 3;
  return std::min(t, rows);
}

// queries [Hq, N, D] scaled and contiguous, k and v [1, Hkv, S, D], m [N, S] or, when causal, none
// -> [1, N, Hq, D].
inline torch::Tensor run(const torch::Tensor& queries, const torch::Tensor& k, const torch::Tensor& v,
                         const c10::optional<torch::Tensor>& m, bool causal) {
  const int64_t Hq = queries.size(0), N = queries.size(1), D = queries.size(2);
  const int64_t Hkv = k.size(1), S = k.size(2), G = Hq / Hkv, rows = G * N;
  auto out = torch::empty({1, N, Hq, D}, queries.options());
  const Problem p{queries.data_ptr<float>(), k.data_ptr<float>(), k.stride(1), k.stride(2),
                  v.data_ptr<float>(), v.stride(1), causal ? nullptr : m->data_ptr<float>(),
                  out.data_ptr<float>(), Hq, G, N, S, D, causal, 0};
  const int64_t t = tile_rows(rows, Hkv, at::get_num_threads()), tiles = (rows + t - 1) / t;
  const int64_t count = Hkv * tiles;
  at::parallel_for(0, count, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> buf(t * S);  // [t, S] scores, then probabilities
    for (int64_t n = t0; n < t1; ++n) {
      // Causal tiles cost more the later their nodes: take them from both ends in turn, so that
      // each thread's contiguous share of n holds cheap and dear tiles alike.
      const int64_t i = !causal ? n : n % 2 == 0 ? n / 2 : count - 1 - n / 2;
      const int64_t h = i / tiles, row = (i % tiles) * t;
      tile(p, h, row, std::min(t, rows - row), buf.data());
    }
  });
  return out;
}

}  // namespace oilbird::avx2
