// The float32 argmax of each logit row, from approximate logits and a bound on their error.
//
// oilbird/certified_head.py computes a greedy step's logits u from a bfloat16 copy of the LM head
// (half the bytes of float32) and knows, per row n and token v, a bound
//     |u[n, v] - exact[n, v]| <= s[n] * norms[v],   s[n] = c * ||h[n]||,
// where exact = h[n] . w[v] in real arithmetic and norms[v] = ||w[v]||. A token can then be the
// argmax of the exact logits (or of any float32 evaluation of them, whose own error c covers)
// only if its upper bound reaches the best lower bound of the row:
//     u[n, v] + s[n] * norms[v] >= max_t (u[n, t] - s[n] * norms[t]).
// Those few candidates (one, most rows) are computed again in float32 from the float32 weight w,
// and the largest wins, the lowest id among exact ties, as torch.argmax and transformers' greedy
// decoding pick. So the result is the float32 argmax, not the bfloat16 one.
//
// Per row: one pass for the best lower bound, one for the candidates, one dot product of length
// d per candidate. Threads: ATen's pool splits the rows.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "simd.h"

namespace {

namespace v = oilbird::simd;

// h . w over d floats, float32 FMA in registers.
float dot(const float* h, const float* w, int64_t d) {
  v::vf acc = v::zero();
  int64_t i = 0;
  for (; i + v::kLanes <= d; i += v::kLanes) acc = v::fmadd(v::load(h + i), v::load(w + i), acc);
  float sum = v::reduce_add(acc);
  for (; i < d; ++i) sum += h[i] * w[i];
  return sum;
}

// Row n: its argmax and how many candidates the bound left.
std::pair<int64_t, int64_t> row_argmax(const float* u, const float* h, const float* w, const float* norms,
                                       int64_t V, int64_t d, float s) {
  const v::vf sv = v::set1(s);
  // Pass 1: the best lower bound u - s * norm (and the plain top of u, for rows with NaN).
  v::vf best = v::set1(-std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + v::kLanes <= V; j += v::kLanes) best = v::max(best, v::fnmadd(sv, v::load(norms + j), v::load(u + j)));
  float floor = v::reduce_max(best);
  for (; j < V; ++j) floor = std::max(floor, u[j] - s * norms[j]);
  if (!std::isfinite(floor) || !std::isfinite(s)) {  // NaN or infinite logits: no bound holds
    int64_t top = 0;
    for (j = 1; j < V; ++j)
      if (u[j] > u[top]) top = j;
    return {top, 0};
  }
  // Pass 2: the candidates, whose upper bound u + s * norm reaches it.
  std::vector<int64_t> cand;
  const v::vf fv = v::set1(floor);
  for (j = 0; j + v::kLanes <= V; j += v::kLanes) {
    // greater_bits(a, b) is a > b; the candidates are upper >= floor, i.e. not (floor > upper).
    uint32_t out = v::greater_bits(fv, v::fmadd(sv, v::load(norms + j), v::load(u + j)));
    uint32_t in = ~out & ((1u << v::kLanes) - 1);
    while (in) {
      cand.push_back(j + __builtin_ctz(in));
      in &= in - 1;
    }
  }
  for (; j < V; ++j)
    if (!(floor > u[j] + s * norms[j])) cand.push_back(j);
  if (cand.size() == 1) return {cand[0], 1};
  int64_t arg = cand[0];
  float top = dot(h, w + cand[0] * d, d);
  for (size_t i = 1; i < cand.size(); ++i) {
    const float x = dot(h, w + cand[i] * d, d);
    if (x > top) top = x, arg = cand[i];  // strictly greater: ties keep the lower id
  }
  return {arg, static_cast<int64_t>(cand.size())};
}

}  // namespace

// u [N, V] approximate logits, h [N, d] hidden states, w [V, d] the float32 weight, norms [V] its
// row norms (all float32, contiguous); c the error coefficient -> (argmax [N], candidates [N]).
std::tuple<torch::Tensor, torch::Tensor> certified_argmax(
    const torch::Tensor& u, const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& norms,
    double c) {
  TORCH_CHECK(u.dim() == 2 && h.dim() == 2 && w.dim() == 2 && norms.dim() == 1, "certified_argmax: shapes");
  TORCH_CHECK(u.scalar_type() == torch::kFloat32 && h.scalar_type() == torch::kFloat32 &&
              w.scalar_type() == torch::kFloat32 && norms.scalar_type() == torch::kFloat32,
              "certified_argmax: float32 tensors");
  TORCH_CHECK(u.is_contiguous() && h.is_contiguous() && w.is_contiguous() && norms.is_contiguous(),
              "certified_argmax: contiguous tensors");
  const int64_t N = u.size(0), V = u.size(1), d = h.size(1);
  TORCH_CHECK(h.size(0) == N && w.size(0) >= V && w.size(1) == d && norms.size(0) >= V,
              "certified_argmax: u [N, V], h [N, d], w [V, d], norms [V]");
  auto arg = torch::empty({N}, u.options().dtype(torch::kLong));
  auto count = torch::empty({N}, u.options().dtype(torch::kLong));
  const float *pu = u.data_ptr<float>(), *ph = h.data_ptr<float>(), *pw = w.data_ptr<float>(),
              *pn = norms.data_ptr<float>();
  int64_t *pa = arg.data_ptr<int64_t>(), *pc = count.data_ptr<int64_t>();
  at::parallel_for(0, N, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      double norm = 0;
      for (int64_t i = 0; i < d; ++i) norm += double(ph[n * d + i]) * ph[n * d + i];
      const float s = static_cast<float>(c * std::sqrt(norm) * (1 + 1e-6));  // rounded up
      auto [a, k] = row_argmax(pu + n * V, ph + n * d, pw, pn, V, d, s);
      pa[n] = a, pc[n] = k;
    }
  });
  return {arg, count};
}
