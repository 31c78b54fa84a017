// Top-k of each row of a logits matrix (float32 or bfloat16), in one vectorized scan per row.
//
// The verifier needs the top-k (and the argmax) of every tree node's logits, and a prefill
// harvest needs them at every prompt position: [rows, vocab] with k = 10 of ~50k-150k. PyTorch's
// topk is a general selection; here each row is scanned once, one register of logits at a time, against the
// current k-th best value: almost every block fails the comparison and costs one instruction.
// bfloat16 logits are widened in registers, so the harvest's bfloat16 LM head needs no float32
// copy of its [rows, vocab] output.
//
// Order: descending by value; an exact tie keeps the lower index first (a later equal value never
// displaces an earlier one), so the top-1 is the argmax as torch.argmax and transformers' greedy
// decoding pick it (the lowest tied id).

#include <torch/types.h>  // not torch/extension.h: half the parse time; only skinny_gemm.cpp binds to Python
#include <ATen/Parallel.h>

#include <limits>
#include <tuple>

#include "topk_scan.h"

namespace {

using oilbird::row_topk;

template <typename T>
void all_rows(const torch::Tensor& x, int64_t k, float* vals, int64_t* ids) {
  const int64_t M = x.size(0), V = x.size(1);
  const T* data = x.data_ptr<T>();
  at::parallel_for(0, M, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) row_topk(data + r * V, V, k, vals + r * k, ids + r * k);
  });
}

}  // namespace

// x [M, V] float32 or bfloat16 (copied if its rows are not contiguous); 1 <= k <= V -> (values [M, k] float32, ids [M, k]).
std::tuple<torch::Tensor, torch::Tensor> topk_rows(const torch::Tensor& x, int64_t k) {
  TORCH_CHECK(x.dim() == 2, "topk_rows: a 2-D tensor");
  TORCH_CHECK(k >= 1 && k <= x.size(1), "topk_rows: k must be in [1, vocab]");
  auto rows = x.stride(1) == 1 && x.stride(0) == x.size(1) ? x : x.contiguous();
  auto vals = torch::empty({x.size(0), k}, x.options().dtype(torch::kFloat32));
  auto ids = torch::empty({x.size(0), k}, x.options().dtype(torch::kLong));
  if (x.scalar_type() == torch::kFloat32) {
    all_rows<float>(rows, k, vals.data_ptr<float>(), ids.data_ptr<int64_t>());
  } else {
    TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "topk_rows: float32 or bfloat16 logits");
    all_rows<at::BFloat16>(rows, k, vals.data_ptr<float>(), ids.data_ptr<int64_t>());
  }
  return {vals, ids};
}
