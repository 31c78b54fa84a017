// What both tree-attention kernels (tree_attention_avx2.h, tree_attention_lanes.h) are given: the
// queries, the cache's keys and values in place, the mask or the causal rule, and where to write.
#pragma once

#include <cstdint>

namespace oilbird {

struct AttentionProblem {
  const float* q;      // [Hq, N, D] scaled queries, contiguous
  const float* k;      // keys: row s of head h at k + h * k_head + s * k_row
  int64_t k_head, k_row;
  const float* v;      // values: row s of head h at v + h * v_head + s * D
  int64_t v_head;
  const float* mask;   // [N, S] additive; null when causal
  float* out;          // [N, Hq, D]
  int64_t Hq, G, N, S, D;
  bool causal;         // node n attends keys [0, S - N + n]: the last N keys are the N queries'
  int64_t open;        // keys [0, open) have mask 0 in every row (the lanes kernel adds none there)
};

}  // namespace oilbird
