// Causal self-attention of prompts over their own K and V: a prefill with nothing of its prompts in the
// cache before it (no prefix-cache hit, no earlier chunk), the prompts packed one after another without
// padding (flash_attn_varlen_func's layout, vLLM's query_start_loc):
//
//   prefill_attention(query, key, value, query_start_loc, scale) -> out
//       query             [num_tokens, num_heads, head_dim]     fp32
//       key, value        [num_tokens, num_kv_heads, head_dim]  fp32; num_heads a multiple of num_kv_heads
//       query_start_loc   [num_seqs + 1] int32 or int64, cumulative prompt lengths
//       out               [num_tokens, num_heads, head_dim]     fp32
//   token t of a prompt attends to its prompt's tokens up to and including t: softmax(scale q K^T) V.
//
// FlashAttention (Dao et al., 2022; the same loop as torch's CPU flash attention and vLLM's CPU SDPA
// backend): one task is a block of kBQ query tokens of one prompt and one KV head, with the G query heads
// that share that KV head (grouped-query attention) as G rows per token, so every key and value is read
// once for all of them. It walks the prompt's keys kBK at a time, up to its last token only (a block
// wholly after it is never computed; only the block on the diagonal is masked), with an online softmax:
//     s = q K_blk^T                        an MR x kBK register tile per k step, keys transposed once per prompt
//     m' = max(m, max s);  p = exp(scale s - m');  l = l e^(m - m') + sum p;  o = o e^(m - m') + p V_blk
//     out = o / l                          at the end
// What it saves against torch's flash attention on the prompts padded to the longest (engine/model_executor/
// attention.py's prefill_varlen_reference, the torch path): the padded rows' work and the copies into and out
// of the padded layout. Tasks are taken longest first from a shared counter, so that the two threads end
// together although a task's work grows with its place in the prompt. A task's first block of keys starts
// its accumulators at 0 (nothing to rescale) and its last writes the normalised rows straight to the
// output; the masked lanes' exp stays a normal float (csrc/vec_exp.h's clamp: a denormal result costs Intel
// cores a microcode assist per vector). One layer of SmolLM2-135M (9 query heads, 3 KV heads, head_dim 64;
// avx512, 2 cores; throwaway harness, the torch path and this kernel in one process, two sittings):
// 16 prompts of 8-128 tokens 3.91 -> 1.00-1.04 ms, 8 of 8-512 tokens 26.2-26.7 -> 4.4 ms, 16 x 128
// 3.48-3.74 -> 2.17-2.40 ms, 1 x 1,024 7.73-8.42 -> 5.24-5.55 ms, 1 x 128 0.21-0.23 -> 0.13-0.14 ms.
// 64 keys a block was no faster (more of each diagonal block computed and masked).
//
// Inference only, fp32 only, head_dim a multiple of the vector width (any other shape: the torch path).
// Built with the other CPU kernels by engine/cpu/ops.py, against csrc/simd.h's vector (16, 8 or 4 floats).

#include <ATen/core/Tensor.h>  // not ATen/ATen.h, which declares every operator: a third of a build's time
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "ops.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "simd.h"
#include "vec_exp.h"

namespace {

constexpr int kVecsK = 2;                             // vectors of keys per block
constexpr int kBK = kVecsK * simd::kWidth;            // keys per block: 32 (AVX-512), 16 (AVX2), 8 (generic)
constexpr int kBQ = 16;                               // query tokens per task
#if defined(__AVX512F__)
constexpr int kMRS = 12;  // rows per score tile: 12 x 2 accumulators of AVX-512's 32 registers
constexpr int kMRV = 6;   // rows per p V tile: 6 x 4 accumulators
#else
constexpr int kMRS = 6;   // 6 x 2 of AVX2's (and SSE's) 16
constexpr int kMRV = 3;   // 3 x 4
#endif
constexpr int kVecsV = 4;  // vectors of head_dim per p V tile

// S[r, 0:kBK] = sum over d of Q[r, d] * Kt[d, 0:kBK], for the MR rows of q (row-major, D apart). DT: head_dim
// as a constant (64, 128: the rows' offsets become constants) or 0 (D at run time).
template <int MR, int DT>
void score_tile(const float* q, const float* kt, int64_t D, float* s) {
  using simd::vfloat;
  const int64_t ld = DT > 0 ? DT : D;
  vfloat acc[MR][kVecsK];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kVecsK; ++v) acc[m][v] = simd::zero();
  for (int64_t d = 0; d < ld; ++d) {
    vfloat k[kVecsK];
    for (int v = 0; v < kVecsK; ++v) k[v] = simd::load(kt + d * kBK + v * simd::kWidth);
#pragma GCC unroll 12
    for (int m = 0; m < MR; ++m) {
      const vfloat qm = simd::set1(q[m * ld + d]);
      for (int v = 0; v < kVecsK; ++v) acc[m][v] = simd::fmadd(qm, k[v], acc[m][v]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kVecsK; ++v) simd::store(s + m * kBK + v * simd::kWidth, acc[m][v]);
}

template <int DT>
void scores(const float* q, int64_t R, const float* kt, int64_t D, float* s) {
  int64_t r = 0;
  for (; r + kMRS <= R; r += kMRS) score_tile<kMRS, DT>(q + r * D, kt, D, s + r * kBK);
  for (; r < R; ++r) score_tile<1, DT>(q + r * D, kt, D, s + r * kBK);
}

// O[r, c0:c0 + DV W] = alpha[r] O[r, ...] + sum over j < nk of P[r, j] * V[j, c0:...], for the MR rows at o
// (ldo = head_dim): the online softmax's rescaling of the rows, folded into the load of their accumulators.
// kFirst: the rows' first block of keys, with nothing before it to rescale (the accumulators start at 0).
// kLast: their last block: the rows, divided by their softmax sums (times inv[m]), go to the output rows
// dst[m] rather than back to o.
template <int MR, int DV, bool kFirst, bool kLast>
void pv_tile(const float* p, const float* alpha, float* o, int64_t ldo, float* const* dst, const float* inv, const float* const* v_rows,
             int nk, int64_t c0) {
  using simd::vfloat;
  vfloat acc[MR][DV];
  for (int m = 0; m < MR; ++m) {
    const vfloat a = simd::set1(alpha[m]);
    for (int c = 0; c < DV; ++c) acc[m][c] = kFirst ? simd::zero() : simd::load(o + m * ldo + c0 + c * simd::kWidth) * a;
  }
  for (int j = 0; j < nk; ++j) {
    vfloat v[DV];
    for (int c = 0; c < DV; ++c) v[c] = simd::load(v_rows[j] + c0 + c * simd::kWidth);
#pragma GCC unroll 6
    for (int m = 0; m < MR; ++m) {
      const vfloat pm = simd::set1(p[m * kBK + j]);
      for (int c = 0; c < DV; ++c) acc[m][c] = simd::fmadd(pm, v[c], acc[m][c]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    if constexpr (kLast) {
      const vfloat w = simd::set1(inv[m]);
      for (int c = 0; c < DV; ++c) simd::store(dst[m] + c0 + c * simd::kWidth, acc[m][c] * w);
    } else {
      for (int c = 0; c < DV; ++c) simd::store(o + m * ldo + c0 + c * simd::kWidth, acc[m][c]);
    }
  }
}

// p V for all R rows of a task, a tile of MR rows x kVecsV vectors at a time.
template <bool kFirst, bool kLast>
void pv_all(int64_t R, const float* p, const float* alpha, float* o, int64_t D, float* const* dst, const float* inv, const float* const* v_rows,
            int nk) {
  const int64_t vecs = D / simd::kWidth;
  int64_t r = 0;
  for (; r + kMRV <= R; r += kMRV) {
    int64_t c = 0;
    for (; c + kVecsV <= vecs; c += kVecsV)
      pv_tile<kMRV, kVecsV, kFirst, kLast>(p + r * kBK, alpha + r, o + r * D, D, dst + r, inv + r, v_rows, nk, c * simd::kWidth);
    for (; c < vecs; ++c) pv_tile<kMRV, 1, kFirst, kLast>(p + r * kBK, alpha + r, o + r * D, D, dst + r, inv + r, v_rows, nk, c * simd::kWidth);
  }
  for (; r < R; ++r)
    for (int64_t c = 0; c < vecs; ++c) pv_tile<1, 1, kFirst, kLast>(p + r * kBK, alpha + r, o + r * D, D, dst + r, inv + r, v_rows, nk, c * simd::kWidth);
}

inline simd::vfloat exp_vec(simd::vfloat x) {
#if defined(PAGEDATTENTION_LAB_SIMD)
  return vec_exp::expv(x);
#else
  float lanes[simd::kWidth];
  simd::store(lanes, x);
  for (float& e : lanes) e = vec_exp::exp1(e);
  return simd::load(lanes);
#endif
}

// The online softmax of NR rows' blocks of scores (already scaled; row i at s + i kBK, of which the first
// visible[i] count), NR rows at once so that their reductions and exponentials, each a chain of dependent
// instructions, overlap. Row i: s becomes p = exp(s - m') (0 past visible), m[i] becomes m', alpha[i] gets
// e^(m - m'), what the row's earlier sums are rescaled by, and lsum[i kWidth ...] = lsum alpha + p summed
// a vector at a time (its lanes are added once, at the end of the row's keys).
template <int NR>
inline void softmax_rows(float* s, const int* visible, float* m, float* lsum, float* alpha) {
  using simd::vfloat;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  vfloat x[NR][kVecsK];
  float m_new[NR];
  for (int i = 0; i < NR; ++i) {
    vfloat mx = simd::set1(kNegInf);
    for (int v = 0; v < kVecsK; ++v) {
      const int lanes = std::clamp(visible[i] - v * simd::kWidth, 0, simd::kWidth);
      x[i][v] = simd::load(s + i * kBK + v * simd::kWidth);
      if (lanes < simd::kWidth) x[i][v] = simd::first_lanes(x[i][v], lanes, kNegInf);
      mx = simd::vmax(mx, x[i][v]);
    }
    m_new[i] = std::max(m[i], simd::reduce_max(mx));
  }
  for (int i = 0; i < NR; ++i) {
    const vfloat shift = simd::set1(m_new[i]);
    vfloat total = simd::zero();
    for (int v = 0; v < kVecsK; ++v) {
      const int lanes = std::clamp(visible[i] - v * simd::kWidth, 0, simd::kWidth);
      vfloat e = exp_vec(x[i][v] - shift);
      if (lanes < simd::kWidth) e = simd::first_lanes(e, lanes, 0.0f);  // exp is clamped at e^-86, not 0
      simd::store(s + i * kBK + v * simd::kWidth, e);
      total = total + e;
    }
    const float a = m[i] == m_new[i] ? 1.0f : m[i] == kNegInf ? 0.0f : vec_exp::exp1(m[i] - m_new[i]);
    float* l = lsum + i * simd::kWidth;
    simd::store(l, simd::fmadd(simd::load(l), simd::set1(a), total));
    alpha[i] = a;
    m[i] = m_new[i];
  }
}

#if defined(__AVX512F__)
constexpr int kSoftmaxRows = 4;  // 4 x 2 score vectors, the exponential's constants and temporaries: 32 registers
#else
constexpr int kSoftmaxRows = 2;  // AVX2's (and SSE's) 16
#endif

struct Task {
  int64_t start, len;  // the prompt: its first token, its length
  int64_t q0, nq;      // the task's query tokens, from the prompt's start
  int64_t kv_head;
  const float* kt;     // the prompt's keys of this KV head, transposed block by block: [blocks, head_dim, kBK]
};

// One task: rows r = i * G + g (query token q0 + i, query head kv_head * G + g).
void run_task(const Task& t, const float* query, const float* value, float* out, int64_t H, int64_t Hkv, int64_t D, float scale,
              std::vector<float>& buf, std::vector<float*>& dst) {
  const int64_t G = H / Hkv, R = t.nq * G;
  buf.resize(static_cast<size_t>(D * R + R * kBK + R * D + R * simd::kWidth + 3 * R));
  float *qs = buf.data(), *s = qs + D * R, *o = s + R * kBK, *l = o + R * D, *m = l + R * simd::kWidth, *alpha = m + R, *inv = alpha + R;
  dst.resize(static_cast<size_t>(R));
  for (int64_t i = 0; i < t.nq; ++i) {  // the task's queries, scaled: a token's G heads are adjacent in query and out
    const float* q = query + ((t.start + t.q0 + i) * H + t.kv_head * G) * D;
    for (int64_t e = 0; e < G * D; ++e) qs[i * G * D + e] = q[e] * scale;
    for (int64_t g = 0; g < G; ++g) dst[i * G + g] = out + ((t.start + t.q0 + i) * H + t.kv_head * G + g) * D;
  }
  std::fill(m, m + R, -std::numeric_limits<float>::infinity());
  std::fill(l, l + R * simd::kWidth, 0.0f);
  const float* v_rows[kBK];
  int visible[kSoftmaxRows];
  const int64_t keys = t.q0 + t.nq;  // the last query token sees keys 0 .. keys - 1 of its prompt
  for (int64_t j0 = 0; j0 < keys; j0 += kBK) {
    const int nk = static_cast<int>(std::min<int64_t>(kBK, keys - j0));
    const float* kt = t.kt + (j0 / kBK) * D * kBK;
    for (int j = 0; j < nk; ++j) v_rows[j] = value + ((t.start + j0 + j) * Hkv + t.kv_head) * D;
    if (D == 64)
      scores<64>(qs, R, kt, D, s);
    else if (D == 128)
      scores<128>(qs, R, kt, D, s);
    else
      scores<0>(qs, R, kt, D, s);
    int64_t r = 0;
    for (; r + kSoftmaxRows <= R; r += kSoftmaxRows) {
      for (int i = 0; i < kSoftmaxRows; ++i)  // causal: row r + i is query token q0 + (r + i) / G
        visible[i] = static_cast<int>(std::clamp<int64_t>(t.q0 + (r + i) / G - j0 + 1, 0, nk));
      softmax_rows<kSoftmaxRows>(s + r * kBK, visible, m + r, l + r * simd::kWidth, alpha + r);
    }
    for (; r < R; ++r) {
      visible[0] = static_cast<int>(std::clamp<int64_t>(t.q0 + r / G - j0 + 1, 0, nk));
      softmax_rows<1>(s + r * kBK, visible, m + r, l + r * simd::kWidth, alpha + r);
    }
    const bool first = j0 == 0, last = j0 + kBK >= keys;
    if (last)
      for (r = 0; r < R; ++r) inv[r] = 1.0f / simd::reduce_add(simd::load(l + r * simd::kWidth));
    if (first && last)
      pv_all<true, true>(R, s, alpha, o, D, dst.data(), inv, v_rows, nk);
    else if (first)
      pv_all<true, false>(R, s, alpha, o, D, dst.data(), inv, v_rows, nk);
    else if (last)
      pv_all<false, true>(R, s, alpha, o, D, dst.data(), inv, v_rows, nk);
    else
      pv_all<false, false>(R, s, alpha, o, D, dst.data(), inv, v_rows, nk);
  }
}

}  // namespace

namespace pagedattention_lab {

at::Tensor prefill_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor& query_start_loc,
                             double scale) {
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3, "prefill_attention: query, key and value must be 3-D [num_tokens, heads, head_dim]");
  TORCH_CHECK(query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat && value.scalar_type() == at::kFloat,
              "prefill_attention: float32 only, got ", query.scalar_type(), ", ", key.scalar_type(), " and ", value.scalar_type());
  TORCH_CHECK(query.device().is_cpu() && key.device().is_cpu() && value.device().is_cpu() && query_start_loc.device().is_cpu(),
              "prefill_attention: CPU tensors only");
  const int64_t T = query.size(0), H = query.size(1), D = query.size(2), Hkv = key.size(1);
  TORCH_CHECK(key.sizes() == value.sizes() && key.size(0) == T && key.size(2) == D, "prefill_attention: key and value must be [", T, ", num_kv_heads, ", D,
              "], got ", key.sizes(), " and ", value.sizes());
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, "prefill_attention: num_heads (", H, ") must be a multiple of num_kv_heads (", Hkv, ")");
  TORCH_CHECK(D > 0 && D % simd::kWidth == 0, "prefill_attention: head_dim must be a multiple of ", simd::kWidth, ", got ", D);
  TORCH_CHECK(query_start_loc.dim() == 1 && query_start_loc.size(0) >= 1 &&
                  (query_start_loc.scalar_type() == at::kInt || query_start_loc.scalar_type() == at::kLong),
              "prefill_attention: query_start_loc must be 1-D int32 or int64 [num_seqs + 1]");
  const at::Tensor loc = query_start_loc.to(at::kLong).contiguous();
  const int64_t* starts = loc.data_ptr<int64_t>();
  const int64_t S = loc.size(0) - 1;
  TORCH_CHECK(starts[0] == 0 && starts[S] == T, "prefill_attention: query_start_loc must run from 0 to num_tokens (", T, "), got ", starts[0], " to ", starts[S]);
  // Each prompt's keys, per KV head, transposed a block of kBK keys at a time (kt[d, j]; 0 past the prompt's
  // end): every task of the prompt reads its blocks from here.
  std::vector<int64_t> first_block(S + 1, 0);
  for (int64_t s = 0; s < S; ++s) {
    const int64_t len = starts[s + 1] - starts[s];
    TORCH_CHECK(len >= 0, "prefill_attention: query_start_loc must not decrease");
    first_block[s + 1] = first_block[s] + (len + kBK - 1) / kBK;
  }
  const at::Tensor k = key.contiguous();
  const float* kp = k.data_ptr<float>();
  const at::Tensor kt_buf = at::empty({first_block[S] * Hkv * D * kBK}, key.options());  // every element is written below
  float* kt = kt_buf.data_ptr<float>();
  at::parallel_for(0, S * Hkv, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t s = i / Hkv, h = i % Hkv, len = starts[s + 1] - starts[s];
      float* dst = kt + (first_block[s] * Hkv + h * (first_block[s + 1] - first_block[s])) * D * kBK;
      for (int64_t j = 0; j < (first_block[s + 1] - first_block[s]) * kBK; ++j) {
        const float* src = kp + ((starts[s] + std::min(j, len - 1)) * Hkv + h) * D;
        float* col = dst + (j / kBK) * D * kBK + j % kBK;
        for (int64_t d = 0; d < D; ++d) col[d * kBK] = j < len ? src[d] : 0.0f;
      }
    }
  });
  std::vector<Task> tasks;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t len = starts[s + 1] - starts[s], blocks = first_block[s + 1] - first_block[s];
    for (int64_t q0 = 0; q0 < len; q0 += kBQ)
      for (int64_t h = 0; h < Hkv; ++h)
        tasks.push_back({starts[s], len, q0, std::min<int64_t>(kBQ, len - q0), h, kt + (first_block[s] * Hkv + h * blocks) * D * kBK});
  }
  // Longest first (a task's keys: q0 + nq), so that the last tasks taken are short ones.
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.q0 + a.nq > b.q0 + b.nq; });
  const at::Tensor q = query.contiguous(), v = value.contiguous();
  at::Tensor out = at::empty({T, H, D}, query.options());
  const float *qp = q.data_ptr<float>(), *vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  std::atomic<int64_t> next{0};
  const int64_t n = static_cast<int64_t>(tasks.size());
  at::parallel_for(0, std::min<int64_t>(n, at::get_num_threads()), 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> buf;
    std::vector<float*> dst;
    for (int64_t w = w0; w < w1; ++w)  // one worker per index; each takes tasks until none is left
      for (int64_t i = next++; i < n; i = next++) run_task(tasks[i], qp, vp, op, H, Hkv, D, static_cast<float>(scale), buf, dst);
  });
  return out;
}

}  // namespace pagedattention_lab

TORCH_LIBRARY_FRAGMENT(pagedattention_lab, m) {
  m.def("prefill_attention(Tensor query, Tensor key, Tensor value, Tensor query_start_loc, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(pagedattention_lab, CPU, m) { m.impl("prefill_attention", &pagedattention_lab::prefill_attention); }
