// The float32 top-k of each logit row, from approximate logits and a bound on their error.
//
// oilbird/lm_head.py computes a greedy step's logits u from a bfloat16 copy of the LM head (half
// the bytes of float32) and knows, per row n and token v, a bound
//     |u[n, v] - exact[n, v]| <= s[n] * norms[v],   s[n] = c * ||h[n]||,
// where exact = h[n] . w[v] in real arithmetic and norms[v] = ||w[v]||. At least k tokens reach
// the row's k-th best lower bound L = kth_max_t (u[n, t] - s[n] * norms[t]); a token whose upper
// bound u[n, v] + s[n] * norms[v] falls below L therefore cannot be among the top k of the exact
// logits (nor of any float32 evaluation of them, whose own error c covers). The candidates left
// (k plus a few, most rows) are computed again in float32 from the float32 weight w, and their
// top k taken: descending, exact ties by the lower id, as our top-k kernel, torch.argmax and
// transformers' greedy decoding order them. So the result is float32's top-k and argmax, values
// included, not the bfloat16 copy's.
//
// Per row: one pass for the k-th best lower bound, one for the candidates, one dot product of
// length d per candidate. Threads: ATen's pool splits the rows.
// `certified_topk_rows` takes each row's s itself, for heads whose bound is not c * ||h[n]||
// (oilbird/int8_head.py: rounded inputs, s[n] from the rounding's own error).

#include <torch/types.h>  // not torch/extension.h: half the parse time; only skinny_gemm.cpp binds to Python
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <functional>
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

// The k-th best lower bound u - s * norm of a row (k tokens surely reach it), in one scan that keeps
// only the k best values: no [V] array of bounds is allocated, written and read again (196 KB a
// row at V = 49,152; this scan took 0.61-0.78x that pass's time for 1-32 rows, stop 63). The
// bounds are the same vector FMAs, so the floor, and the candidates it leaves, are unchanged.
float kth_lower_bound(const float* u, const float* norms, int64_t V, float s, int64_t k) {
  std::vector<float> best;  // descending, at most k
  best.reserve(k + 1);
  float thr = -std::numeric_limits<float>::infinity();  // the k-th best so far (-inf until k are in)
  auto insert = [&](float value) {
    if (static_cast<int64_t>(best.size()) == k) best.pop_back();
    best.insert(std::upper_bound(best.begin(), best.end(), value, std::greater<float>()), value);
    if (static_cast<int64_t>(best.size()) == k) thr = best.back();
  };
  const v::vf sv = v::set1(s);
  alignas(64) float lanes[v::kLanes];
  int64_t j = 0;
  for (; j + v::kLanes <= V; j += v::kLanes) {
    const v::vf lower = v::fnmadd(sv, v::load(norms + j), v::load(u + j));
    uint32_t m = static_cast<int64_t>(best.size()) < k ? (1u << v::kLanes) - 1 : v::greater_bits(lower, v::set1(thr));
    if (!m) continue;  // almost every block
    v::store(lanes, lower);
    for (; m; m &= m - 1) {
      const float value = lanes[__builtin_ctz(m)];
      if (static_cast<int64_t>(best.size()) < k || value > thr) insert(value);
    }
  }
  for (; j < V; ++j) {
    const float value = u[j] - s * norms[j];
    if (static_cast<int64_t>(best.size()) < k || value > thr) insert(value);
  }
  return static_cast<int64_t>(best.size()) == k ? best.back() : -std::numeric_limits<float>::infinity();
}

// Row n: its exact top-k into vals/ids (descending; exact ties by the lower id), and how many
// candidates the bound left (0: a row with NaN or infinite values, whose top-k is u's own).
int64_t row_topk(const float* u, const float* h, const float* w, const float* norms, int64_t V, int64_t d,
                 float s, int64_t k, float* vals, int64_t* ids) {
  const v::vf sv = v::set1(s);
  // Pass 1: the k-th best lower bound.
  const float floor = kth_lower_bound(u, norms, V, s, k);
  std::vector<std::pair<float, int64_t>> cand;  // (value, id)
  int64_t j = 0;
  if (!std::isfinite(floor) || !std::isfinite(s)) {  // NaN or infinite logits: no bound holds
    for (j = 0; j < V; ++j) cand.emplace_back(std::isnan(u[j]) ? -INFINITY : u[j], j);
  } else {
    // Pass 2: the candidates, whose upper bound u + s * norm reaches it; their float32 logits.
    const v::vf fv = v::set1(floor);
    for (j = 0; j + v::kLanes <= V; j += v::kLanes) {
      // greater_bits(a, b) is a > b; the candidates are upper >= floor, i.e. not (floor > upper).
      uint32_t in = ~v::greater_bits(fv, v::fmadd(sv, v::load(norms + j), v::load(u + j))) & ((1u << v::kLanes) - 1);
      for (; in; in &= in - 1) cand.emplace_back(0.0f, j + __builtin_ctz(in));
    }
    for (; j < V; ++j)
      if (!(floor > u[j] + s * norms[j])) cand.emplace_back(0.0f, j);
    for (auto& c : cand) c.first = dot(h, w + c.second * d, d);
  }
  const int64_t n = static_cast<int64_t>(cand.size());
  auto first = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::partial_sort(cand.begin(), cand.begin() + std::min(k, n), cand.end(), first);
  // n >= k: the k tokens that set the floor are candidates (upper >= lower >= floor); the guard
  // keeps a row readable should rounding ever break that.
  for (int64_t i = 0; i < k; ++i) vals[i] = i < n ? cand[i].first : -INFINITY, ids[i] = i < n ? cand[i].second : 0;
  return std::isfinite(floor) && std::isfinite(s) ? n : 0;
}

}  // namespace

namespace {

void check_inputs(const char* name, const torch::Tensor& u, const torch::Tensor& h, const torch::Tensor& w,
                  const torch::Tensor& norms, int64_t k) {
  TORCH_CHECK(u.dim() == 2 && h.dim() == 2 && w.dim() == 2 && norms.dim() == 1, name, ": shapes");
  TORCH_CHECK(u.scalar_type() == torch::kFloat32 && h.scalar_type() == torch::kFloat32 &&
              w.scalar_type() == torch::kFloat32 && norms.scalar_type() == torch::kFloat32,
              name, ": float32 tensors");
  TORCH_CHECK(u.is_contiguous() && h.is_contiguous() && w.is_contiguous() && norms.is_contiguous(),
              name, ": contiguous tensors");
  const int64_t N = u.size(0), V = u.size(1), d = h.size(1);
  TORCH_CHECK(h.size(0) == N && w.size(0) >= V && w.size(1) == d && norms.size(0) >= V,
              name, ": u [N, V], h [N, d], w [V, d], norms [V]");
  TORCH_CHECK(k >= 1 && k <= V, name, ": k must be in [1, vocab]");
}

// Every row's top-k, row n with bound scale scale(n).
template <typename Scale>
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> topk_all(const torch::Tensor& u, const torch::Tensor& h,
                                                                 const torch::Tensor& w, const torch::Tensor& norms,
                                                                 int64_t k, Scale scale) {
  const int64_t N = u.size(0), V = u.size(1), d = h.size(1);
  auto vals = torch::empty({N, k}, u.options());
  auto ids = torch::empty({N, k}, u.options().dtype(torch::kLong));
  auto count = torch::empty({N}, u.options().dtype(torch::kLong));
  const float *pu = u.data_ptr<float>(), *ph = h.data_ptr<float>(), *pw = w.data_ptr<float>(),
              *pn = norms.data_ptr<float>();
  float* pv = vals.data_ptr<float>();
  int64_t *pi = ids.data_ptr<int64_t>(), *pc = count.data_ptr<int64_t>();
  at::parallel_for(0, N, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n)
      pc[n] = row_topk(pu + n * V, ph + n * d, pw, pn, V, d, scale(n, ph + n * d), k, pv + n * k, pi + n * k);
  });
  return {vals, ids, count};
}

}  // namespace

// u [N, V] approximate logits, h [N, d] hidden states, w [V, d] the float32 weight, norms [V] its
// row norms (all float32, contiguous); c the error coefficient; 1 <= k <= V
// -> (values [N, k] float32, ids [N, k], candidates [N]).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> certified_topk(
    const torch::Tensor& u, const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& norms,
    double c, int64_t k) {
  check_inputs("certified_topk", u, h, w, norms, k);
  const int64_t d = h.size(1);
  return topk_all(u, h, w, norms, k, [c, d](int64_t, const float* row) {
    double norm = 0;
    for (int64_t i = 0; i < d; ++i) norm += double(row[i]) * row[i];
    return static_cast<float>(c * std::sqrt(norm) * (1 + 1e-6));  // rounded up
  });
}

// As certified_topk, with each row's bound scale given: |u[n, v] - exact[n, v]| <= s[n] * norms[v]
// (s [N] float32, rounded up by the caller; NaN or infinite: the row keeps u's own order).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> certified_topk_rows(
    const torch::Tensor& u, const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& norms,
    const torch::Tensor& s, int64_t k) {
  check_inputs("certified_topk_rows", u, h, w, norms, k);
  TORCH_CHECK(s.dim() == 1 && s.size(0) == u.size(0) && s.scalar_type() == torch::kFloat32 && s.is_contiguous(),
              "certified_topk_rows: s must be float32 [N]");
  const float* ps = s.data_ptr<float>();
  return topk_all(u, h, w, norms, k, [ps](int64_t n, const float*) { return ps[n]; });
}
