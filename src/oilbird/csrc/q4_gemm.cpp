// Few-row GEMM on weights as a GGUF file holds them (llama.cpp's blocks): y[M, N] = x[M, K] @
// W[N, K]^T (+ bias), where each weight is rebuilt in registers as w = fma(d, q, m) from a small
// integer q and its group's scale d and offset m (the layouts and the block types they hold:
// block_layouts.h).
//
// transformers' loader de-quantizes such a file to float32, each weight one rounding of an exact
// d' q' + m' (SmolLM2's Q4_1: fl(d q + m), d q exact in float32, 11 + 4 bits). fma(d, q, m) is
// that same value bit for bit, and every row's sum runs sequentially over k in float32 FMAs, as
// the float32 kernel (skinny_kernels.h) does: the output equals that kernel's on the de-quantized
// weight, bit for bit, at any row count. What changes is the memory stream: 0.625 bytes a weight
// (Q4_1) instead of 4, so a one-token forward, bound by reading its weights, reads 66 MB instead
// of 425 (SmolLM2-135M). Rebuilding costs arithmetic (about 4 vector operations per 32 FMAs at 16
// rows): up to 16 rows it hides under the FMAs of one pass; more rows rebuild each group of blocks
// once into a buffer and run the float32 kernel's row tiles over it (block_tall), level with the
// float32 kernel at 64-128.
//
// AVX-512 only (q4_available() says whether it was built); elsewhere the float32 kernel serves.

#include <torch/types.h>  // not torch/extension.h: half the parse time; only skinny_gemm.cpp binds to Python
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "block_layouts.h"
#if defined(__AVX512F__)
#include "skinny_kernels.h"
#endif

namespace {

constexpr int64_t kB = oilbird::blocks::kOutputs;  // outputs per block
constexpr int64_t kG = 32;                          // inputs per Q4_1 / Q5_0 group
constexpr int64_t kNibbleBytes = 320, kFiveBytes = 384;  // block_layouts.h: Nibbles, FiveBits
constexpr int64_t kByteInputs = 16, kByteBytes = 384;    // Bytes

}  // namespace

bool q4_available() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

namespace {

// d and m [N, groups] (float16 or float32) -> each group's 16 d then 16 m, as bytes [N/16, groups, 32 * size].
torch::Tensor group_scales(const torch::Tensor& d, const torch::Tensor& m, int64_t N, int64_t groups) {
  return torch::stack({d.view({N / kB, kB, groups}).transpose(1, 2), m.view({N / kB, kB, groups}).transpose(1, 2)}, 2)
      .contiguous().view({N / kB, groups, 2 * kB}).view(torch::kUInt8);
}

}  // namespace

// q [N, K] uint8 (0..15, or 0..31 with `bits` 5), d and m [N, K/32] float16 -> [N/16, K/32, 320]
// bytes (384 with `bits` 5).
torch::Tensor pack_q4(const torch::Tensor& q, const torch::Tensor& d, const torch::Tensor& m, int64_t bits) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == torch::kUInt8, "pack_q4: q must be a 2-D uint8 tensor");
  const int64_t N = q.size(0), K = q.size(1);
  TORCH_CHECK(N % kB == 0 && K % kG == 0, "pack_q4: out_features must be a multiple of 16 and in_features of 32");
  TORCH_CHECK(d.scalar_type() == torch::kHalf && m.scalar_type() == torch::kHalf && d.dim() == 2 &&
                  d.size(0) == N && d.size(1) == K / kG && m.sizes() == d.sizes(),
              "pack_q4: d and m must be float16 [N, K/32]");
  TORCH_CHECK(bits == 4 || bits == 5, "pack_q4: bits must be 4 or 5, got ", bits);
  TORCH_CHECK(q.max().item<int>() < (1 << bits), "pack_q4: q must hold ", bits, "-bit values");
  const int64_t groups = K / kG;
  // q: [N/16, 16, G, 16 pairs, 2] -> [N/16, G, 16 pairs, 16]
  torch::Tensor dm = group_scales(d, m, N, groups);  // [N/16, G, 64]
  torch::Tensor low = q.bitwise_and(15).contiguous().view({N / kB, kB, groups, kG / 2, 2});
  torch::Tensor nibbles = low.select(4, 0).bitwise_or(low.select(4, 1).mul(16)).permute({0, 2, 3, 1}).contiguous()
                     .view({N / kB, groups, 256});  // [N/16, G, 256]
  if (bits == 4) return torch::cat({dm, nibbles}, 2).contiguous();  // [N/16, G, 320]
  // Fifth bits: per pair a 32-bit little-endian word, bit s * 16 + j = output j's input 2 kk + s.
  torch::Tensor high = q.bitwise_right_shift(4).contiguous().view({N / kB, kB, groups, kG / 2, 2})
                     .permute({0, 2, 3, 4, 1}).contiguous().view({N / kB, groups, kG / 2, 4, 8});
  torch::Tensor weights = torch::tensor({1, 2, 4, 8, 16, 32, 64, 128}, torch::kUInt8);
  torch::Tensor words = high.mul(weights).sum(4).to(torch::kUInt8).view({N / kB, groups, 64});  // [N/16, G, 64]
  return torch::cat({dm, nibbles, words}, 2).contiguous();  // [N/16, G, 384]
}

// q [N, K] uint8, d and m [N, K/16] float32 -> [N/16, K/16, 384] bytes (block_layouts.h: Bytes).
torch::Tensor pack_q8(const torch::Tensor& q, const torch::Tensor& d, const torch::Tensor& m) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == torch::kUInt8, "pack_q8: q must be a 2-D uint8 tensor");
  const int64_t N = q.size(0), K = q.size(1), G = kByteInputs;
  TORCH_CHECK(N % kB == 0 && K % G == 0, "pack_q8: out_features and in_features must be multiples of 16");
  TORCH_CHECK(d.scalar_type() == torch::kFloat32 && m.scalar_type() == torch::kFloat32 && d.dim() == 2 &&
                  d.size(0) == N && d.size(1) == K / G && m.sizes() == d.sizes(),
              "pack_q8: d and m must be float32 [N, K/16]");
  const int64_t groups = K / G;
  // q: [N/16, 16, groups, 16] -> [N/16, groups, 16 inputs, 16]
  torch::Tensor dm = group_scales(d, m, N, groups);  // [N/16, groups, 128]
  torch::Tensor plane = q.contiguous().view({N / kB, kB, groups, G}).permute({0, 2, 3, 1}).contiguous()
                    .view({N / kB, groups, G * kB});  // [N/16, groups, 256]
  return torch::cat({dm, plane}, 2).contiguous();  // [N/16, groups, 384]
}

#if defined(__AVX512F__)
namespace {

// M rows by NB blocks starting at block nb0, over all K.
template <typename L, int M, int NB>
void block_rows(const float* x, const uint8_t* wp, float* y, int64_t K, int64_t N, int64_t nb0, const float* bias) {
  constexpr int64_t kLines = (L::kBytes + 63) / 64;
  __m512 acc[M][NB];
  for (int r = 0; r < M; ++r)
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_ps();
  const int64_t groups = K / L::kInputs;
  const uint8_t* w[NB];
  for (int b = 0; b < NB; ++b) w[b] = wp + (nb0 + b) * groups * L::kBytes;
  for (int64_t g = 0; g < groups; ++g) {
    __m512 dv[NB], mv[NB];
    for (int b = 0; b < NB; ++b) {
      const uint8_t* p = w[b] + g * L::kBytes;
      // Far ahead into L2 (the memory stream), near ahead into L1, as the float32 kernel does.
      for (int l = 0; l < kLines; ++l) {
        _mm_prefetch(reinterpret_cast<const char*>(p + 16 * L::kBytes + l * 64), _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(p + 3 * L::kBytes + l * 64), _MM_HINT_T0);
      }
      L::scales(p, dv[b], mv[b]);
    }
    for (int64_t kk = 0; kk < L::kInputs / 2; ++kk) {
      __m512 w0[NB], w1[NB];
      for (int b = 0; b < NB; ++b) {
        __m512i lo, hi;  // q of inputs k and k + 1
        L::pair(w[b] + g * L::kBytes, kk, lo, hi);
        w0[b] = _mm512_fmadd_ps(dv[b], _mm512_cvtepi32_ps(lo), mv[b]);  // the loader's float32 weight
        w1[b] = _mm512_fmadd_ps(dv[b], _mm512_cvtepi32_ps(hi), mv[b]);
      }
      const int64_t k = g * L::kInputs + 2 * kk;
      for (int r = 0; r < M; ++r) {  // input k, then k + 1: each row's sum in k order
        const __m512 x0 = _mm512_set1_ps(x[r * K + k]);
        for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_fmadd_ps(x0, w0[b], acc[r][b]);
      }
      for (int r = 0; r < M; ++r) {
        const __m512 x1 = _mm512_set1_ps(x[r * K + k + 1]);
        for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_fmadd_ps(x1, w1[b], acc[r][b]);
      }
    }
  }
  for (int r = 0; r < M; ++r)
    for (int b = 0; b < NB; ++b) {
      __m512 out = acc[r][b];
      if (bias) out = _mm512_add_ps(out, _mm512_loadu_ps(bias + (nb0 + b) * kB));  // after the sum, as the float32 kernel
      _mm512_storeu_ps(y + r * N + (nb0 + b) * kB, out);
    }
}

template <typename L, int M, int NB>
void block_spread(const float* x, const uint8_t* wp, float* y, int64_t K, int64_t N, const float* bias) {
  const int64_t blocks = N / kB, groups = blocks / NB;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) block_rows<L, M, NB>(x, wp, y, K, N, g * NB, bias);
  });
  for (int64_t nb = groups * NB; nb < blocks; ++nb) block_rows<L, M, 1>(x, wp, y, K, N, nb, bias);
}

// M rows in one pass: NB blocks at a time, NB the widest of 4, 2, 1 that fits the registers
// (M x NB accumulators, 2 NB rebuilt weights, 2 NB scales) and whose busiest thread reads the
// fewest blocks (SmolLM2's 12-block k and v projections in groups of 4 would leave a thread idle).
template <typename L, int M>
void short_rows(const float* x, const uint8_t* wp, float* y, int64_t K, int64_t N, const float* bias) {
  constexpr int NB = M <= 3 ? 4 : M <= 8 ? 2 : 1;
  const int64_t blocks = N / kB, threads = std::max(1, at::get_num_threads());
  auto busiest = [&](int64_t nb) { return (blocks / nb + threads - 1) / threads * nb + blocks % nb; };
  if constexpr (NB > 2) {
    if (busiest(2) < busiest(NB) && busiest(2) <= busiest(1)) return block_spread<L, M, 2>(x, wp, y, K, N, bias);
  }
  if constexpr (NB > 1) {
    if (busiest(1) < busiest(NB) && (NB <= 2 || busiest(1) < busiest(2))) return block_spread<L, M, 1>(x, wp, y, K, N, bias);
  }
  block_spread<L, M, NB>(x, wp, y, K, N, bias);
}

// Rebuild the float32 weights of `nb` blocks starting at block nb0 into buf [nb][K][16] (the float32
// kernel's packed layout): fma(d, q, m), the same values the one-pass kernel uses.
template <typename L>
void rebuild(const uint8_t* wp, float* buf, int64_t K, int64_t nb0, int64_t nb) {
  const int64_t groups = K / L::kInputs;
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* w = wp + (nb0 + b) * groups * L::kBytes;
    float* out = buf + b * K * kB;
    for (int64_t g = 0; g < groups; ++g) {
      const uint8_t* p = w + g * L::kBytes;
      __m512 dv, mv;
      L::scales(p, dv, mv);
      for (int64_t kk = 0; kk < L::kInputs / 2; ++kk) {
        __m512i lo, hi;
        L::pair(p, kk, lo, hi);
        const int64_t k = g * L::kInputs + 2 * kk;
        _mm512_storeu_ps(out + k * kB, _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(lo), mv));
        _mm512_storeu_ps(out + (k + 1) * kB, _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(hi), mv));
      }
    }
  }
}

// Many rows: per group of the float32 kernel's kTallBlocks blocks, rebuild its weights once into a
// per-thread buffer (K x 32 floats: L2-resident) and run the float32 kernel's row tiles over it,
// as its tall path does over weights it reads from memory once. Same FMA order, same bits.
template <typename L>
void block_tall(const float* x, const uint8_t* wp, float* y, int64_t M, int64_t K, int64_t N, const float* bias) {
  namespace o = oilbird;
  constexpr int64_t NB = o::kTallBlocks;
  const int64_t blocks = N / kB, groups = (blocks + NB - 1) / NB;
  const int64_t ntiles = (M + o::kShortRows - 1) / o::kShortRows, base = M / ntiles, extra = M % ntiles;
  at::parallel_for(0, groups, 1, [&](int64_t g0, int64_t g1) {
    std::vector<float> buf(NB * K * kB);
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t nb0 = g * NB, nb = std::min(NB, blocks - nb0);
      rebuild<L>(wp, buf.data(), K, nb0, nb);
      const float* b = bias ? bias + nb0 * kB : nullptr;
      for (int64_t t = 0, m = 0; t < ntiles; ++t) {
        const int64_t rows = base + (t < extra ? 1 : 0);
        (nb == NB ? o::kTiles<float, NB> : o::kTiles<float, 1>)[rows](
            x + m * K, buf.data(), y + m * N + nb0 * kB, K, N, 0, b, nullptr, 0);
        m += rows;
      }
    }
  });
}

using RowsFn = void (*)(const float*, const uint8_t*, float*, int64_t, int64_t, const float*);
constexpr int kMaxRows = 16;  // rows of one pass over the blocks; more rows: block_tall
template <typename L>
constexpr RowsFn kRows[kMaxRows + 1] = {nullptr, short_rows<L, 1>, short_rows<L, 2>, short_rows<L, 3>,
                                        short_rows<L, 4>, short_rows<L, 5>, short_rows<L, 6>, short_rows<L, 7>,
                                        short_rows<L, 8>, short_rows<L, 9>, short_rows<L, 10>, short_rows<L, 11>,
                                        short_rows<L, 12>, short_rows<L, 13>, short_rows<L, 14>,
                                        short_rows<L, 15>, short_rows<L, 16>};

template <typename L>
void block_gemm(const float* x, const uint8_t* wp, float* y, int64_t M, int64_t K, int64_t N, const float* bias) {
  if (M > kMaxRows) {
    block_tall<L>(x, wp, y, M, K, N, bias);
  } else if (M > 0) {
    kRows<L>[M](x, wp, y, K, N, bias);
  }
}

}  // namespace
#endif

namespace {

// y [..., N] = x [..., K] @ W^T (+ bias) on `packed` [N/16, K/G, bytes] in layout L (`name`: the entry point, for errors).
template <typename L>
torch::Tensor run_blocks(const char* name, const torch::Tensor& x, const torch::Tensor& packed,
                         const c10::optional<torch::Tensor>& bias, int64_t inputs) {
  TORCH_CHECK(q4_available(), name, ": built without AVX-512");
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == torch::kFloat32, name, ": x must be a float32 tensor [..., K]");
  const int64_t K = packed.size(1) * inputs, N = packed.size(0) * kB;
  TORCH_CHECK(x.size(-1) == K, name, ": x has ", x.size(-1), " features, the weight ", K);
  TORCH_CHECK(!bias.has_value() || (bias->scalar_type() == torch::kFloat32 && bias->numel() == N && bias->is_contiguous()),
              name, ": bias must be a contiguous float32 [N]");
  // Any leading shape: reshaped here, where it costs a fraction of what it costs in Python (this
  // is called ~200 times a forward).
  const auto rows = x.reshape({-1, K}).contiguous();  // [M, K]
  auto out_shape = x.sizes().vec();
  out_shape.back() = N;
  auto y = torch::empty(out_shape, x.options());  // [..., N]
#if defined(__AVX512F__)
  block_gemm<L>(rows.data_ptr<float>(), packed.data_ptr<uint8_t>(), y.data_ptr<float>(), rows.size(0), K, N,
                bias.has_value() ? bias->data_ptr<float>() : nullptr);
#endif
  return y;
}

}  // namespace

// x [..., K] float32, packed [N/16, K/32, 320 or 384] (pack_q4), bias [N] float32 or None -> y [..., N] float32.
torch::Tensor linear_q4(const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(packed.dim() == 3 && (packed.size(2) == kNibbleBytes || packed.size(2) == kFiveBytes) &&
                  packed.scalar_type() == torch::kUInt8,
              "linear_q4: a weight packed by pack_q4");
#if defined(__AVX512F__)
  if (packed.size(2) == kFiveBytes) return run_blocks<oilbird::blocks::FiveBits>("linear_q4", x, packed, bias, kG);
  return run_blocks<oilbird::blocks::Nibbles>("linear_q4", x, packed, bias, kG);
#else
  TORCH_CHECK(false, "linear_q4: built without AVX-512");
#endif
}

// x [..., K] float32, packed [N/16, K/16, 384] (pack_q8), bias [N] float32 or None -> y [..., N] float32.
torch::Tensor linear_q8(const torch::Tensor& x, const torch::Tensor& packed, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kByteBytes && packed.scalar_type() == torch::kUInt8,
              "linear_q8: a weight packed by pack_q8");
#if defined(__AVX512F__)
  return run_blocks<oilbird::blocks::Bytes>("linear_q8", x, packed, bias, kByteInputs);
#else
  TORCH_CHECK(false, "linear_q8: built without AVX-512");
#endif
}
