// The top-k of one row in one vectorized scan (float32 or bfloat16 values): shared by the top-k of
// logit rows (topk.cpp) and the certified head's lower bounds (certified_topk.cpp).
//
// Each block of values is compared with the current k-th best at once: almost every block fails
// and costs one instruction. Order: descending; an exact tie keeps the lower index first (a later
// equal value never displaces an earlier one).
#pragma once

#include <cstdint>
#include <limits>

#include "simd.h"

namespace oilbird {

template <typename T>
void row_topk(const T* x, int64_t V, int64_t k, float* vals, int64_t* ids) {
  int64_t filled = 0;
  float thr = -std::numeric_limits<float>::infinity();  // the k-th best so far
  auto insert = [&](float v, int64_t j) {
    int64_t p = filled < k ? filled++ : k - 1;
    while (p > 0 && vals[p - 1] < v) {  // strictly smaller move down: ties keep the lower index
      vals[p] = vals[p - 1];
      ids[p] = ids[p - 1];
      --p;
    }
    vals[p] = v;
    ids[p] = j;
    if (filled == k) thr = vals[k - 1];
  };
  int64_t j = 0;
  for (; j < V && filled < k; ++j) insert(static_cast<float>(x[j]), j);  // the first k enter
  for (; j + simd::kLanes <= V; j += simd::kLanes) {
    uint32_t m = simd::greater_bits(simd::load(x + j), simd::set1(thr));
    while (m) {
      const int b = __builtin_ctz(m);
      const float value = static_cast<float>(x[j + b]);
      if (value > thr) insert(value, j + b);  // the threshold may have risen within the block
      m &= m - 1;
    }
  }
  for (; j < V; ++j) {
    const float value = static_cast<float>(x[j]);
    if (value > thr) insert(value, j);
  }
}

}  // namespace oilbird
