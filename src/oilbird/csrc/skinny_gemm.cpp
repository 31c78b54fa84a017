// Skinny fp32 GEMM for the verifier's forwards: y[M, N] = x[M, K] @ W[N, K]^T (+ bias), M small.
//
// A tree forward multiplies a few rows (1-64 tree nodes) by every weight matrix of the model. At
// such M the work is bound by reading the weights from memory, and a kernel that streams each
// weight once, while the FMAs on the few rows hide under the loads, costs about what one row
// costs. oneDNN's and MKL's kernels on this project's CPU do not overlap the two: their time is
// roughly the load time plus the compute time (docs/RESULTS.md, issue 15).
//
// Layout: W is packed once as [N/16][K][16] ("pack"): each block of 16 outputs streams its K x 16
// weights contiguously, one 64-byte line per k. The kernel keeps M x NB accumulators (16 outputs
// each: one AVX-512 register or two AVX2 ones, simd.h) in registers and, per k, loads NB weight
// lines and broadcasts the M inputs.
// Summation is sequential over k in fp32 FMA, so results differ from oneDNN's or MKL's in the last
// bits (the audit compares every output with transformers' generate()).
//
// A bfloat16 weight (packed the same way, half the bytes) is widened to float32 in registers: for
// the LM head, whose greedy argmax oilbird/lm_head.py certifies against float32, this halves
// the bytes a one-row forward streams; the arithmetic stays float32.
//
// Threads: ATen's pool (torch.set_num_threads) splits the output blocks.

#include <torch/extension.h>

#include "skinny_kernels.h"

torch::Tensor tree_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const c10::optional<torch::Tensor>& mask, double scale,
                             const std::string& kernel, bool causal);  // tree_attention.cpp
std::string default_kernel(int64_t rows);                                       // tree_attention.cpp
std::tuple<torch::Tensor, torch::Tensor> topk_rows(const torch::Tensor& x, int64_t k);  // topk.cpp
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> certified_topk(
    const torch::Tensor& u, const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& norms,
    double c, int64_t k);  // certified_topk.cpp
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> certified_topk_rows(
    const torch::Tensor& u, const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& norms,
    const torch::Tensor& s, int64_t k);  // certified_topk.cpp
bool int8_head_available();                                                       // int8_head.cpp
torch::Tensor pack_int8_head(const torch::Tensor& q, const torch::Tensor& d);    // int8_head.cpp
std::tuple<torch::Tensor, torch::Tensor> int8_head_logits(const torch::Tensor& x, const torch::Tensor& packed,
                                                          const std::string& kernel);  // int8_head.cpp
bool int8_head_tiles_available();                                                // int8_head.cpp
bool bf16_dot_available();                                                        // bf16_dot_gemm.cpp
torch::Tensor pack_pairs(const torch::Tensor& w);                                 // bf16_dot_gemm.cpp
torch::Tensor linear_pairs(const torch::Tensor& x, const torch::Tensor& packed);  // bf16_dot_gemm.cpp
std::tuple<torch::Tensor, torch::Tensor> key_topk(const torch::Tensor& keys, const torch::Tensor& query,
                                                  int64_t start, int64_t stop, int64_t k);  // key_search.cpp
std::tuple<torch::Tensor, torch::Tensor> key_topk_lists(const torch::Tensor& keys, const torch::Tensor& query,
                                                        const std::vector<torch::Tensor>& lists,
                                                        const std::vector<int64_t>& heads,
                                                        const std::vector<int64_t>& counts, int64_t first_id,
                                                        int64_t below_id, int64_t k);
std::tuple<torch::Tensor, torch::Tensor> key_topk_rows(const torch::Tensor& keys, const torch::Tensor& query,
                                                       const torch::Tensor& rows, int64_t k);  // key_search.cpp
bool q4_available();                                                               // q4_gemm.cpp
torch::Tensor pack_q4(const torch::Tensor& q, const torch::Tensor& d, const torch::Tensor& m,
                      int64_t bits);                                              // q4_gemm.cpp
torch::Tensor linear_q4(const torch::Tensor& x, const torch::Tensor& packed,
                        const c10::optional<torch::Tensor>& bias);                // q4_gemm.cpp
torch::Tensor pack_q8(const torch::Tensor& q, const torch::Tensor& d, const torch::Tensor& m);  // q4_gemm.cpp
torch::Tensor linear_q8(const torch::Tensor& x, const torch::Tensor& packed,
                        const c10::optional<torch::Tensor>& bias);                // q4_gemm.cpp
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);  // rms_norm.cpp
bool amx_available();                                                              // amx_blocks.cpp
torch::Tensor linear_amx(const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>& bias,
                         bool bytes, int64_t center, int64_t dot_max);            // amx_blocks.cpp
bool amx_bf16_available();                                                         // amx_bf16_blocks.cpp
torch::Tensor linear_amx_bf16(const torch::Tensor& x, const torch::Tensor& packed,
                              const c10::optional<torch::Tensor>& bias, bool bytes, int64_t center);                                    // amx_bf16_blocks.cpp

// W [N, K] float32 or bfloat16 (N a multiple of 16) -> the packed layout [N/16, K, 16], same dtype.
torch::Tensor pack(const torch::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && (w.scalar_type() == torch::kFloat32 || w.scalar_type() == torch::kBFloat16),
              "pack: a 2-D float32 or bfloat16 weight");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(N % oilbird::kBlock == 0, "pack: out_features must be a multiple of 16 (pad the weight)");
  return w.contiguous().view({N / oilbird::kBlock, oilbird::kBlock, K}).transpose(1, 2).contiguous();
}

// x [..., K] float32, packed [N/16, K, 16] float32 or bfloat16, bias [N] or None -> y [..., N] float32.
// Any leading shape: reshaped here, where it costs a fraction of what it costs in Python.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& packed,
                     const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == torch::kFloat32, "linear: x must be a float32 tensor [..., K]");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == oilbird::kBlock && packed.is_contiguous(),
              "linear: a contiguous weight packed by pack");
  const int64_t K = packed.size(1), N = packed.size(0) * oilbird::kBlock;
  TORCH_CHECK(x.size(-1) == K, "linear: x has ", x.size(-1), " features, the weight ", K);
  const auto rows = x.reshape({-1, K}).contiguous();  // [M, K]
  const int64_t M = rows.size(0);
  auto out_shape = x.sizes().vec();
  out_shape.back() = N;
  auto y = torch::empty(out_shape, x.options());  // [..., N]
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  if (packed.scalar_type() == torch::kBFloat16) {
    oilbird::gemm(rows.data_ptr<float>(), packed.data_ptr<c10::BFloat16>(), y.data_ptr<float>(), M, K, N, b);
  } else {
    oilbird::gemm(rows.data_ptr<float>(), packed.data_ptr<float>(), y.data_ptr<float>(), M, K, N, b);
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "pack a [N, K] float32 weight into [N/16, K, 16]");
  m.def("linear", &linear, "y = x @ W^T (+ bias) from a packed weight");
  m.def("tree_attention", &tree_attention, "grouped attention of few queries under a tree mask",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"), py::arg("scale"), py::arg("kernel") = "",
        py::arg("causal") = false);
  m.def("default_kernel", &default_kernel, "the tree-attention kernel this build runs for so many query rows");
  m.def("topk_rows", &topk_rows, "top-k of each row, ties to the lower index");
  m.def("certified_topk", &certified_topk,
        "float32 top-k of each row from approximate logits and an error bound");
  m.def("certified_topk_rows", &certified_topk_rows,
        "float32 top-k of each row from approximate logits and each row's own bound scale");
  m.def("int8_head_available", &int8_head_available, "whether the AVX512-VNNI LM head over Q8_0 blocks was built");
  m.def("pack_int8_head", &pack_int8_head, "pack Q8_0 blocks (q + 128 [V, K] uint8, d [V, K/32] float32) into [V/16, K/32, 576]");
  m.def("int8_head_logits", &int8_head_logits, "approximate logits of float32 rows rounded to bytes, and each row's error bracket",
        py::arg("x"), py::arg("packed"), py::arg("kernel") = "vnni");
  m.def("int8_head_tiles_available", &int8_head_tiles_available,
        "whether the int8 head's AMX tiles path was built and the OS granted its tiles");
  m.def("bf16_dot_available", &bf16_dot_available, "whether the AVX512_BF16 GEMM was built");
  m.def("pack_pairs", &pack_pairs, "pack a [N, K] bfloat16 weight into [N/16, K/2, 32] input pairs");
  m.def("key_topk", &key_topk, "cosine top-k of a query over float16 key rows [start, stop)");
  m.def("key_topk_rows", &key_topk_rows, "cosine top-k of a query over listed float16 key rows");
  m.def("key_topk_lists", &key_topk_lists, "cosine top-k of a query over the rows of inverted lists");
  m.def("linear_pairs", &linear_pairs, "y = bf16(x) @ W^T on AVX512_BF16 dot products");
  m.def("q4_available", &q4_available, "whether the Q4_1 / Q5_0 GEMM was built (AVX-512)");
  m.def("pack_q4", &pack_q4, "pack 4- or 5-bit blocks (q [N, K] uint8, d and m [N, K/32] float16) into "
        "[N/16, K/32, 320 or 384]", py::arg("q"), py::arg("d"), py::arg("m"), py::arg("bits") = 4);
  m.def("linear_q4", &linear_q4, "y = x @ W^T (+ bias) from Q4_1 or Q5_0 blocks, bit-identical to `linear` on fl(d q + m)");
  m.def("pack_q8", &pack_q8, "pack a byte plane (q [N, K] uint8, d and m [N, K/16] float32) into [N/16, K/16, 384]");
  m.def("linear_q8", &linear_q8, "y = x @ W^T (+ bias) from a byte plane, bit-identical to `linear` on fl(d q + m)");
  m.def("amx_available", &amx_available, "whether the AMX GEMM over blocks was built and the OS granted its tiles");
  m.def("linear_amx", &linear_amx, "y = x @ W^T (+ bias) from pack_q4 / pack_q8 blocks on AMX tiles (a row's bits independent of the other rows)");
  m.def("amx_bf16_available", &amx_bf16_available, "whether the AMX-BF16 GEMM over blocks was built and granted");
  m.def("linear_amx_bf16", &linear_amx_bf16, "y = x @ W^T (+ bias) from pack_q4 / pack_q8 blocks on AMX bfloat16 tiles (x in three exact parts)");
  m.def("rms_norm", &rms_norm, "RMSNorm of the last dimension in one pass (float32; the mean of squares in float64)");
}
