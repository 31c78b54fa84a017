// The semantic store's search: cosine top-k of one query against float16 unit keys, in one pass.
//
// Oilbird's semantic source scores its query against every visible record of the tenant's store
// at each drafting cycle (ALGORITHMS.md §7: O(M·d) brute force). With PyTorch that was a float16
// matrix-vector product (the query rounded to float16, each score rounded to float16, one thread),
// then a float32 copy and a top-k: on a store of 30,000 records at d = 576 (35 MB) about 2 ms a
// cycle on one core, 2-5% of a decoding cycle. Here each key row is widened to float32 in
// registers, multiplied by the float32 query, summed in float32, and the row's score goes straight
// into a running top-k (topk_scan.h's row scan over a block of scores): one read of the keys, the
// rows split over PyTorch's threads, no [M] temporary beyond a block.
//
// `key_topk` reads rows [start, stop) of the store; `key_topk_rows` reads the listed rows (the
// rejected pool, whose matching rows are scattered in a ring); `key_topk_lists` reads the rows of
// a few inverted lists (semantic_index.ListIndex), gathering them here: in PyTorch the gathering
// took a dozen small tensor operations a list (on SmolLM2's states, 0.32 against 0.23 ms a search
// at 32,768 records; scripts/retrieval_crossover.py). Order: descending; an exact tie keeps the
// lower position first (so the result is deterministic across thread counts).

#include <torch/types.h>  // not torch/extension.h: half the parse time; only skinny_gemm.cpp binds to Python
#include <ATen/Parallel.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "simd.h"
#include "topk_scan.h"

namespace {

using oilbird::simd::vf;
namespace simd = oilbird::simd;

// Eight float16 (AVX2) or sixteen (AVX-512) widened to float32 lanes.
inline vf load_half(const at::Half* p) {
#if defined(__AVX512F__)
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#else
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#endif
}

// float32 dot of one float16 key row with the float32 query; d a multiple of kLanes uses the
// vector loop only, a tail is summed in scalar.
inline float dot(const at::Half* key, const float* q, int64_t d) {
  vf acc0 = simd::zero(), acc1 = simd::zero();
  int64_t j = 0;
  for (; j + 2 * simd::kLanes <= d; j += 2 * simd::kLanes) {
    acc0 = simd::fmadd(load_half(key + j), simd::load(q + j), acc0);
    acc1 = simd::fmadd(load_half(key + j + simd::kLanes), simd::load(q + j + simd::kLanes), acc1);
  }
  for (; j + simd::kLanes <= d; j += simd::kLanes) acc0 = simd::fmadd(load_half(key + j), simd::load(q + j), acc0);
  float sum = simd::reduce_add(simd::add(acc0, acc1));
  for (; j < d; ++j) sum += static_cast<float>(key[j]) * q[j];
  return sum;
}

// Top-k of the scores of `count` rows, row i being keys[row(i)]; positions i in the result.
template <int64_t kAhead, typename RowOf>
std::tuple<torch::Tensor, torch::Tensor> search(const torch::Tensor& keys, const torch::Tensor& query,
                                                int64_t count, int64_t k, RowOf row_of) {
  TORCH_CHECK(keys.dim() == 2 && keys.scalar_type() == torch::kHalf && keys.stride(1) == 1,
              "key search: keys must be a [n, d] float16 matrix with contiguous rows");
  TORCH_CHECK(query.dim() == 1 && query.size(0) == keys.size(1), "key search: query must be [d]");
  auto q = query.to(torch::kFloat32).contiguous();
  k = std::min(k, count);
  auto vals = torch::empty({std::max<int64_t>(k, 0)}, query.options().dtype(torch::kFloat32));
  auto ids = torch::empty({std::max<int64_t>(k, 0)}, query.options().dtype(torch::kLong));
  if (k <= 0) return {vals, ids};
  const int64_t d = keys.size(1), ld = keys.stride(0);
  const at::Half* base = keys.data_ptr<at::Half>();
  const float* qp = q.data_ptr<float>();
  // Scores of a block of rows land in a small buffer and go through the block's top-k; the
  // blocks' top-k lists are then merged. A block is a few thousand rows: its scores stay in L1/L2.
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (count + kBlock - 1) / kBlock;
  std::vector<float> block_vals(blocks * k);
  std::vector<int64_t> block_ids(blocks * k);
  std::vector<int64_t> block_filled(blocks, 0);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> scores(kBlock);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t first = b * kBlock, n = std::min(kBlock, count - first);
      for (int64_t i = 0; i < n; ++i) {
        // Listed rows are scattered (the inverted lists', the rejected pool's): fetch a row a few
        // ahead whole, so its lines come from memory while this one is summed.
        if (kAhead > 0 && i + kAhead < n) {
          const char* next = reinterpret_cast<const char*>(base + row_of(first + i + kAhead) * ld);
          for (int64_t byte = 0; byte < d * 2; byte += 64) _mm_prefetch(next + byte, _MM_HINT_T0);
        }
        scores[i] = dot(base + row_of(first + i) * ld, qp, d);
      }
      const int64_t kk = std::min(k, n);
      oilbird::row_topk(scores.data(), n, kk, block_vals.data() + b * k, block_ids.data() + b * k);
      for (int64_t i = 0; i < kk; ++i) block_ids[b * k + i] += first;
      block_filled[b] = kk;
    }
  });
  // Merge: blocks in order, so among equal scores the lower position stays first.
  std::vector<std::pair<float, int64_t>> all;
  all.reserve(blocks * k);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < block_filled[b]; ++i) all.emplace_back(block_vals[b * k + i], block_ids[b * k + i]);
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  float* vp = vals.data_ptr<float>();
  int64_t* ip = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < k; ++i) {
    vp[i] = all[i].first;
    ip[i] = all[i].second;
  }
  return {vals, ids};
}

}  // namespace

// keys [n, d] float16, query [d]; rows [start, stop) -> (scores [k'] float32, row indices [k']),
// k' = min(k, stop - start), descending.
std::tuple<torch::Tensor, torch::Tensor> key_topk(const torch::Tensor& keys, const torch::Tensor& query,
                                                  int64_t start, int64_t stop, int64_t k) {
  TORCH_CHECK(0 <= start && start <= stop && stop <= keys.size(0), "key_topk: rows out of range");
  auto [vals, pos] = search<0>(keys, query, stop - start, k, [start](int64_t i) { return start + i; });
  return {vals, pos + start};
}

// keys [n, d] float16, query [d], rows [m] int64 -> (scores [k'], positions into `rows` [k']).
std::tuple<torch::Tensor, torch::Tensor> key_topk_rows(const torch::Tensor& keys, const torch::Tensor& query,
                                                       const torch::Tensor& rows, int64_t k) {
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == torch::kLong, "key_topk_rows: rows must be [m] int64");
  auto r = rows.contiguous();
  const int64_t* rp = r.data_ptr<int64_t>();
  const int64_t n = keys.size(0);
  for (int64_t i = 0; i < r.size(0); ++i) TORCH_CHECK(0 <= rp[i] && rp[i] < n, "key_topk_rows: row out of range");
  return search<4>(keys, query, r.size(0), k, [rp](int64_t i) { return rp[i]; });
}

// keys [n, d] float16, query [d]; `lists[i]` holds increasing record ids, live from `heads[i]` to
// `counts[i]`; the rows searched are the ids below `below_id` of every list, as row indices
// (id - first_id), ascending. -> (scores [k'] float32, row indices [k']), descending; an exact tie
// keeps the lower row first, as the exact search over a range does.
std::tuple<torch::Tensor, torch::Tensor> key_topk_lists(const torch::Tensor& keys, const torch::Tensor& query,
                                                        const std::vector<torch::Tensor>& lists,
                                                        const std::vector<int64_t>& heads,
                                                        const std::vector<int64_t>& counts, int64_t first_id,
                                                        int64_t below_id, int64_t k) {
  TORCH_CHECK(lists.size() == heads.size() && lists.size() == counts.size(),
              "key_topk_lists: one head and one count per list");
  std::vector<int64_t> rows;
  for (size_t i = 0; i < lists.size(); ++i) {
    const auto& list = lists[i];
    TORCH_CHECK(list.dim() == 1 && list.scalar_type() == torch::kLong && list.stride(0) == 1,
                "key_topk_lists: a list must be a contiguous [m] int64 tensor");
    TORCH_CHECK(0 <= heads[i] && heads[i] <= counts[i] && counts[i] <= list.size(0),
                "key_topk_lists: a list's head and count must lie within it");
    const int64_t* ids = list.data_ptr<int64_t>();
    const int64_t* live = ids + heads[i];
    const int64_t* end = std::lower_bound(live, ids + counts[i], below_id);
    for (const int64_t* id = live; id != end; ++id) rows.push_back(*id - first_id);
  }
  std::sort(rows.begin(), rows.end());
  const int64_t n = keys.size(0);
  TORCH_CHECK(rows.empty() || (rows.front() >= 0 && rows.back() < n), "key_topk_lists: a listed id is outside the keys");
  auto [vals, pos] = search<4>(keys, query, static_cast<int64_t>(rows.size()), k,
                               [&rows](int64_t i) { return rows[i]; });
  int64_t* pp = pos.data_ptr<int64_t>();
  for (int64_t i = 0; i < pos.size(0); ++i) pp[i] = rows[pp[i]];
  return {vals, pos};
}
