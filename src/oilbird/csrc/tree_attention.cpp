// Tree attention for few-query forwards (AVX-512, float32), exact up to rounding.
//
// A tree forward attends N tree nodes over S = cached + N keys under the tree mask. PyTorch's CPU
// SDPA kernel runs its small matrix products through MKL, which on this project's AMD CPU takes a
// slow generic path: at 64 nodes attention was a quarter of SmolLM2's forward (docs/RESULTS.md,
// issue 15). This kernel is one pass of online-softmax ("flash") attention per tile of R query
// rows, in registers:
//
//   for each block of 16 keys:  s = q K_blk^T + mask            (R x 16 scores, FMAs over D)
//                               m' = max(m, max s); p = exp(s - m')
//                               l = l e^(m - m') + sum p;  o = o e^(m - m') + p V_blk
//   out = o / l
//
// Grouped-query attention without copies: every query head of a key/value head's group reads
// that head's keys and values in place (rows of the cache, any head stride). Keys are packed per
// call into [S/16][D][16] so that 16 keys' scores come from D broadcast FMAs; values are read
// as cache rows. exp is a degree-7 polynomial after range reduction (error ~1e-8 relative).
//
// Supported: head_dim 64 or 128, mask [N, S] additive float32 (finfo.min or -inf where masked).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <limits>

namespace {

constexpr int64_t kKeys = 16;  // keys per block: one AVX-512 register of scores

// e^x for 16 floats: x = k ln2 + r, |r| <= ln2/2, e^r by Taylor to degree 7, times 2^k.
inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-88.0f);  // below: e^x < 2^-126, returned as 0
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);  // Cody-Waite: ln2 in two parts
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(~tiny, _mm512_scalef_ps(p, k));
}

struct Problem {
  const float* q;      // [Hq, N, D] scaled queries, contiguous
  const float* keys;   // [Hkv][S16/16][D][16] packed keys
  const float* v;      // values: row s of head h at v + h * v_head + s * D
  int64_t v_head;
  const float* mask;   // [N, S]
  float* out;          // [N, Hq, D]
  int64_t Hq, G, N, S, D;
};

// R query rows (flattened over the group's heads and nodes, from `row`) of key/value head h.
template <int R, int DB>
void tile(const Problem& p, int64_t h, int64_t row, int64_t rows) {
  constexpr int64_t D = DB * 16;
  const int64_t blocks = (p.S + kKeys - 1) / kKeys;
  const float* qrow[R];
  const float* mrow[R];
  for (int r = 0; r < R; ++r) {
    const int64_t i = row + std::min<int64_t>(r, rows - 1);  // spare lanes repeat the last row
    qrow[r] = p.q + (h * p.G * p.N + i) * D;
    mrow[r] = p.mask + (i % p.N) * p.S;
  }
  __m512 o[R][DB];
  float m[R], l[R];
  for (int r = 0; r < R; ++r) {
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
    for (int b = 0; b < DB; ++b) o[r][b] = _mm512_setzero_ps();
  }
  const float* kh = p.keys + h * blocks * D * kKeys;
  const float* vh = p.v + h * p.v_head;
  alignas(64) float probs[R][kKeys];
  for (int64_t kb = 0; kb < blocks; ++kb) {
    const int64_t first = kb * kKeys, valid = std::min<int64_t>(kKeys, p.S - first);
    const __mmask16 live = valid == kKeys ? 0xFFFF : static_cast<__mmask16>((1u << valid) - 1);
    __m512 s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_ps();
    const float* kblk = kh + kb * D * kKeys;
    for (int64_t d = 0; d < D; ++d) {
      const __m512 w = _mm512_loadu_ps(kblk + d * kKeys);
      for (int r = 0; r < R; ++r) s[r] = _mm512_fmadd_ps(_mm512_set1_ps(qrow[r][d]), w, s[r]);
    }
    const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int r = 0; r < R; ++r) {
      s[r] = _mm512_mask_blend_ps(live, neg_inf, _mm512_add_ps(s[r], _mm512_maskz_loadu_ps(live, mrow[r] + first)));
      const float m_new = std::max(m[r], _mm512_reduce_max_ps(s[r]));
      const __m512 e = exp16(_mm512_sub_ps(s[r], _mm512_set1_ps(m_new)));
      const float alpha = std::exp(m[r] - m_new);  // 0 on the first block (m = -inf)
      l[r] = l[r] * alpha + _mm512_reduce_add_ps(e);
      m[r] = m_new;
      for (int b = 0; b < DB; ++b) o[r][b] = _mm512_mul_ps(o[r][b], _mm512_set1_ps(alpha));
      _mm512_store_ps(probs[r], e);
    }
    for (int64_t j = 0; j < valid; ++j) {
      const float* vrow = vh + (first + j) * D;
      for (int b = 0; b < DB; ++b) {
        const __m512 vv = _mm512_loadu_ps(vrow + b * 16);
        for (int r = 0; r < R; ++r) o[r][b] = _mm512_fmadd_ps(_mm512_set1_ps(probs[r][j]), vv, o[r][b]);
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    const int64_t i = row + r, head = h * p.G + i / p.N, node = i % p.N;
    float* dst = p.out + (node * p.Hq + head) * D;
    const __m512 inv = _mm512_set1_ps(1.0f / l[r]);
    for (int b = 0; b < DB; ++b) _mm512_storeu_ps(dst + b * 16, _mm512_mul_ps(o[r][b], inv));
  }
}

template <int DB>
void attend(const Problem& p) {
  constexpr int R = 16 / DB;  // R x DB output registers + R score registers fit in 32
  const int64_t rows = p.G * p.N, tiles = (rows + R - 1) / R;
  at::parallel_for(0, (p.Hq / p.G) * tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t h = t / tiles, row = (t % tiles) * R;
      tile<R, DB>(p, h, row, std::min<int64_t>(R, rows - row));
    }
  });
}

}  // namespace

// q [1, Hq, N, D], k and v [1, Hkv, S, D] (rows of each head contiguous), mask [1, 1, N, S]
// additive float32 -> [1, N, Hq, D], what transformers' attention functions return.
torch::Tensor tree_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && q.size(0) == 1 && q.scalar_type() == torch::kFloat32,
              "tree_attention: q must be [1, H, N, D] float32");
  const int64_t Hq = q.size(1), N = q.size(2), D = q.size(3), Hkv = k.size(1), S = k.size(2);
  TORCH_CHECK(D == 64 || D == 128, "tree_attention: head_dim must be 64 or 128, got ", D);
  TORCH_CHECK(Hq % Hkv == 0, "tree_attention: query heads must be a multiple of key/value heads");
  TORCH_CHECK(v.stride(3) == 1 && v.stride(2) == D, "tree_attention: each head's values must be rows");
  TORCH_CHECK(mask.scalar_type() == torch::kFloat32 && mask.numel() == N * S,
              "tree_attention: mask must be an additive float32 [1, 1, N, S]");
  const int64_t S16 = (S + kKeys - 1) / kKeys * kKeys;
  // Keys packed [Hkv, S16/16, D, 16] (zero padded): 16 keys' scores from D broadcast FMAs.
  auto keys = at::constant_pad_nd(k[0], {0, 0, 0, S16 - S})
                  .view({Hkv, S16 / kKeys, kKeys, D}).transpose(2, 3).contiguous();
  // Scaling the queries costs less than scaling the scores; rounding differs in the last bits.
  auto queries = q[0].mul(scale).contiguous();  // [Hq, N, D]
  auto m = mask.reshape({N, S}).contiguous();
  auto out = torch::empty({1, N, Hq, D}, q.options());
  Problem p{queries.data_ptr<float>(), keys.data_ptr<float>(), v.data_ptr<float>(), v.stride(1),
            m.data_ptr<float>(), out.data_ptr<float>(), Hq, Hq / Hkv, N, S, D};
  if (D == 64) {
    attend<4>(p);
  } else {
    attend<8>(p);
  }
  return out;
}
