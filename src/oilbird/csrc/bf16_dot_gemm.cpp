// Few-row GEMM on AVX-512 BF16 dot products: y[M, N] = bf16(x)[M, K] @ W[N, K]^T, W bfloat16.
//
// Where the CPU has AVX512_BF16 (Zen 4, Cooper Lake, Sapphire Rapids), one vdpbf16ps multiplies
// 32 bfloat16 pairs and adds them into 16 float32 sums: twice the products of a float32 FMA per
// instruction, and half the bytes per weight. oilbird/lm_head.py runs the certified LM head on it
// for rows enough to be bound by arithmetic rather than by memory; there x is rounded to
// bfloat16 too (the bound of its error says so), every product is exact and every sum float32.
//
// Layout: W is packed once as [N/16][K/2][16][2] ("pack_pairs"): for each block of 16 outputs and
// each pair of inputs (2p, 2p+1), the 16 outputs' two weights side by side, one 64-byte line.
// The kernel keeps up to 12 rows x NB blocks of accumulators in registers and, per input pair,
// loads NB lines and broadcasts each row's pair of inputs. Rows beyond 12 are served in tiles,
// each tile reading the block's weights again from L2.
//
// Built only where the compiler is given -mavx512bf16 (oilbird/skinny_gemm.py adds it when the
// CPU reports avx512_bf16); elsewhere `bf16_dot_available()` is false and nothing else here runs.

#include <torch/types.h>  // not torch/extension.h: half the parse time; only skinny_gemm.cpp binds to Python
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

bool bf16_dot_available() {
#if defined(__AVX512BF16__)
  return true;
#else
  return false;
#endif
}

// W [N, K] bfloat16 (N a multiple of 16) -> [N/16, K/2, 32] (K padded to even with zeros).
torch::Tensor pack_pairs(const torch::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == torch::kBFloat16, "pack_pairs: a 2-D bfloat16 weight");
  const int64_t N = w.size(0), K = w.size(1), K2 = (K + 1) / 2;
  TORCH_CHECK(N % 16 == 0, "pack_pairs: out_features must be a multiple of 16 (pad the weight)");
  auto even = K % 2 ? torch::cat({w, w.new_zeros({N, 1})}, 1) : w.contiguous();  // [N, 2 K2]
  // [N/16, 16, K2, 2] -> [N/16, K2, 16, 2]
  return even.view({N / 16, 16, K2, 2}).permute({0, 2, 1, 3}).contiguous().view({N / 16, K2, 32});
}

#if defined(__AVX512BF16__)
namespace {

constexpr int kRows = 12;  // rows of one tile: 12 x NB accumulators + NB loads + 1 broadcast <= 32

template <int M, int NB>
void dot_block(const uint32_t* xp, const uint16_t* wp, float* y, int64_t K2, int64_t N, int64_t nb0) {
  __m512 acc[M][NB];
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_setzero_ps();
  const uint16_t* w[NB];
  for (int b = 0; b < NB; ++b) w[b] = wp + (nb0 + b) * K2 * 32;
  for (int64_t p = 0; p < K2; ++p) {
    __m512bh wv[NB];
    for (int b = 0; b < NB; ++b) {
      _mm_prefetch(reinterpret_cast<const char*>(w[b] + (p + 16) * 32), _MM_HINT_T0);
      wv[b] = (__m512bh)_mm512_loadu_si512(w[b] + p * 32);
    }
    for (int m = 0; m < M; ++m) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(static_cast<int>(xp[m * K2 + p]));
      for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], xv, wv[b]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int b = 0; b < NB; ++b) _mm512_storeu_ps(y + m * N + (nb0 + b) * 16, acc[m][b]);
}

using BlockFn = void (*)(const uint32_t*, const uint16_t*, float*, int64_t, int64_t, int64_t);
template <int NB>
constexpr BlockFn kBlocks[kRows + 1] = {nullptr, dot_block<1, NB>, dot_block<2, NB>, dot_block<3, NB>,
                                        dot_block<4, NB>, dot_block<5, NB>, dot_block<6, NB>,
                                        dot_block<7, NB>, dot_block<8, NB>, dot_block<9, NB>,
                                        dot_block<10, NB>, dot_block<11, NB>, dot_block<12, NB>};

}  // namespace
#endif

// x [M, K] float32 (rounded to bfloat16 here) or bfloat16, packed [N/16, K/2, 32] -> y [M, N] float32.
torch::Tensor linear_pairs(const torch::Tensor& x, const torch::Tensor& packed) {
  TORCH_CHECK(bf16_dot_available(), "linear_pairs: built without AVX512_BF16");
  TORCH_CHECK(x.dim() == 2 && (x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16),
              "linear_pairs: x must be 2-D float32 or bfloat16");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == 32 && packed.scalar_type() == torch::kBFloat16,
              "linear_pairs: a weight packed by pack_pairs");
  const int64_t M = x.size(0), K2 = packed.size(1), N = packed.size(0) * 16;
  TORCH_CHECK((x.size(1) + 1) / 2 == K2, "linear_pairs: x has ", x.size(1), " features, the weight ", 2 * K2);
  // A bfloat16 model's activations come as they are; float32 ones (the certified head's hidden
  // state) are rounded to nearest even.
  auto xb = x.scalar_type() == torch::kBFloat16 ? x : x.to(torch::kBFloat16);
  if (x.size(1) % 2) xb = torch::cat({xb, xb.new_zeros({M, 1})}, 1);
  xb = xb.contiguous();  // [M, 2 K2]: each row's pairs as uint32
  auto y = torch::empty({M, N}, x.options().dtype(torch::kFloat32));
#if defined(__AVX512BF16__)
  const auto* xp = reinterpret_cast<const uint32_t*>(xb.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  float* out = y.data_ptr<float>();
  constexpr int NB = 2;  // blocks per task: 12 x 2 accumulators
  const int64_t blocks = N / 16, groups = (blocks + NB - 1) / NB;
  const int64_t tiles = (M + kRows - 1) / kRows, base = M / std::max<int64_t>(tiles, 1),
                extra = M % std::max<int64_t>(tiles, 1);
  at::parallel_for(0, groups, 4, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t nb = g * NB;
      const bool pair = nb + NB <= blocks;
      for (int64_t t = 0, m = 0; t < tiles; ++t) {  // rows split into nearly equal tiles
        const int64_t rows = base + (t < extra ? 1 : 0);
        (pair ? kBlocks<NB> : kBlocks<1>)[rows](xp + m * K2, wp, out + m * N, K2, N, nb);
        m += rows;
      }
    }
  });
#endif
  return y;
}
