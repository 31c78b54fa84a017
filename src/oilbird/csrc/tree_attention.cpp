// Tree attention for few-query forwards (float32), exact up to rounding: the binding.
//
// A tree forward attends N tree nodes over S = cached + N keys under the tree mask. PyTorch's CPU
// SDPA kernel runs its small matrix products through MKL, which on this project's AMD CPU takes a
// slow generic path. Two kernels of ours: two-pass attention on 8-lane AVX2 registers
// (tree_attention_avx2.h) and attention with query rows in the lanes of the widest registers the
// build has (tree_attention_lanes.h). On AVX2 the two-pass kernel is the faster at every size; on
// AVX-512 (measured on Zen 4) it is below 7 query rows (a group's heads x the nodes) and the
// lanes kernel from there on (it replaced an online-softmax kernel with keys in the lanes, slower
// at every size). Both attend every query head of a group to its key/value head in place (no
// copies per group). The measurements: docs/RESULTS.md, issue 15 (scripts/attention_cost.py).
//
// Supported: head_dim 64 or 128, mask [N, S] additive float32 (finfo.min or -inf where masked).

#include <torch/types.h>  // not torch/extension.h: half the parse time; only skinny_gemm.cpp binds to Python

#include "tree_attention_avx2.h"
#include "tree_attention_lanes.h"

// The kernel `tree_attention` runs for `rows` query rows (a group's heads x the nodes) when the
// caller names none; Python asks it too (oilbird/tree_attention.py: each kernel's causal limit).
std::string default_kernel(int64_t rows) {
#if defined(__AVX512F__)
  // Query rows from which the lanes kernel is the faster with the cache cold from memory, as
  // decoding reads it (scripts/attention_cost.py --cold on Zen 4, docs/RESULTS.md): SmolLM2 (3
  // heads per group) from 3 nodes, Qwen2.5 (7) from 1.
  constexpr int64_t kLanesFromRows = 7;
  return rows < kLanesFromRows ? "two-pass" : "lanes";
#else
  (void)rows;
  return "two-pass";
#endif
}

// q [1, Hq, N, D], k and v [1, Hkv, S, D] (rows of each head contiguous), mask [1, 1, N, S]
// additive float32 or none (every query attends every key) -> [1, N, Hq, D], what transformers'
// attention functions return. `kernel`:
// "lanes", "two-pass", or "" for the one this build's instruction set runs faster at N queries.
// `causal` (no mask): query n attends keys [0, S - N + n], as in a prefill over S - N cached
// tokens; either kernel runs it and skips the keys no row of a tile can see.
torch::Tensor tree_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const c10::optional<torch::Tensor>& mask, double scale,
                             const std::string& kernel, bool causal) {
  TORCH_CHECK(q.dim() == 4 && q.size(0) == 1 && q.scalar_type() == torch::kFloat32,
              "tree_attention: q must be [1, H, N, D] float32");
  const int64_t Hq = q.size(1), N = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  TORCH_CHECK(D == 64 || D == 128, "tree_attention: head_dim must be 64 or 128, got ", D);
  TORCH_CHECK(Hq % Hkv == 0, "tree_attention: query heads must be a multiple of key/value heads");
  TORCH_CHECK(v.stride(3) == 1 && v.stride(2) == D, "tree_attention: each head's values must be rows");
  TORCH_CHECK(k.stride(3) == 1, "tree_attention: each key must be a contiguous row");
  TORCH_CHECK(!mask.has_value() || (mask->scalar_type() == torch::kFloat32 && mask->numel() == N * S),
              "tree_attention: mask must be an additive float32 [1, 1, N, S]");
  TORCH_CHECK(!causal || (!mask.has_value() && S >= N),
              "tree_attention: causal attention takes no mask and S >= N keys");
  // Scaling the queries costs less than scaling the scores; rounding differs in the last bits.
  auto queries = q[0].mul(scale).contiguous();  // [Hq, N, D]
  const std::string chosen = !kernel.empty() ? kernel : default_kernel((Hq / Hkv) * N);
  TORCH_CHECK(chosen == "lanes" || chosen == "two-pass", "tree_attention: unknown kernel '", kernel,
              "' (lanes or two-pass)");
  // Causal (a prefill): no mask; both kernels skip the keys a tile of rows cannot see. One query
  // without a mask (an autoregressive step) is the causal rule's last row: every key, and no
  // [1, S] mask of zeros to allocate and add in each layer.
  if (causal || (!mask.has_value() && N == 1)) {
    return chosen == "lanes" ? oilbird::lanes::run(queries, k, v, c10::nullopt, true)
                             : oilbird::avx2::run(queries, k, v, c10::nullopt, true);
  }
  auto m = mask.has_value() ? mask->reshape({N, S}).contiguous() : torch::zeros({N, S}, q.options());
  return chosen == "lanes" ? oilbird::lanes::run(queries, k, v, m, false) : oilbird::avx2::run(queries, k, v, m, false);
}
