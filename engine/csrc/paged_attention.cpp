// Decode attention on CPU that reads K and V in place through the block table (PagedAttention, paper
// §4.1; vLLM's paged_attention_v1, and its CPU backend's, compute the same thing):
//
//   paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale) -> out
//       query        [num_seqs, num_heads, head_dim]             fp32 or bf16 (may be a strided view)
//       key_cache    [num_blocks, block_size, num_kv_heads, head_dim]   same dtype, head_dim contiguous
//       value_cache  [num_blocks, block_size, num_kv_heads, head_dim]
//       block_tables [num_seqs, max_blocks] int32 (may be a view into a wider table)
//       context_lens [num_seqs] int32, tokens of context (the current token's K and V already written)
//       out          [num_seqs, num_heads, head_dim] in query's dtype; zeros where context_lens == 0
//
// Why: the torch reference (engine/attention.py) first gathers every sequence's K and V into a padded
// copy, then runs SDPA on it: two copies of the whole context per layer and ~10 operator calls. Here
// each (sequence, KV head) is one task that walks its context once:
//   - position p lives at block block_tables[s][p / block_size], offset p % block_size; only
//     positions < context_lens[s] are read, so nothing outside a context (stale K/V, NaN) reaches the
//     result, and table entries past a sequence's blocks are never looked at;
//   - grouped-query attention: the num_heads / num_kv_heads query heads that share a KV head are
//     done together, so each K and V row is read from memory once for all of them;
//   - online softmax (Milakov & Gimelshein 2018; FlashAttention): positions come in tiles of kTile;
//     per tile, the logits of every head of the group, their running maximum, and the weighted sum of
//     V rows rescaled when the maximum grows. Everything is accumulated in fp32, whatever the dtype;
//   - tasks are shared out among threads with at::parallel_for (16 sequences x 3 KV heads = 48 tasks
//     for the default model), each writing its own output rows.
//
// Built with the other CPU kernels by engine/cpu_ops.py. Inference only: no autograd.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "vec_exp.h"

namespace {

constexpr int64_t kTile = 32;  // positions per online-softmax step

// A K or V row as fp32: fp32 rows are used in place, bf16 rows are widened into `buffer`.
inline const float* as_float(const float* row, int64_t, float*) { return row; }
inline const float* as_float(const c10::BFloat16* row, int64_t dim, float* buffer) {
  for (int64_t d = 0; d < dim; ++d) buffer[d] = static_cast<float>(row[d]);
  return buffer;
}

struct Layout {  // element strides of the caches and the query, and the shapes
  int64_t block_size, group, dim;
  int64_t cache_block, cache_slot, cache_head;  // key_cache and value_cache share them (checked)
  int64_t q_seq, q_head;
  int64_t table_seq, table_block;
};

// One (sequence, KV head): out[h] for the `group` query heads h of KV head `kv`. kDim > 0: head_dim
// known when compiling (64, 128: the loops over it unroll fully); 0: L.dim.
template <typename T, int kDim>
void attend(const T* q, const T* key_cache, const T* value_cache, const int32_t* table, int64_t context, int64_t kv,
            const Layout& L, float scale, T* out) {
  const int64_t G = L.group, D = kDim > 0 ? kDim : L.dim;
  std::vector<float> work(2 * G * D + G * kTile + kTile * D + D + 2 * G);
  float* qf = work.data();               // [G, D] the group's queries, scaled
  float* acc = qf + G * D;               // [G, D] running sum of softmax weights x V rows
  float* logits = acc + G * D;           // [G, kTile], then the tile's softmax weights
  float* kbuf = logits + G * kTile;      // [kTile, D] bf16 K rows widened (unused for fp32)
  float* vbuf = kbuf + kTile * D;        // [D] one bf16 V row widened
  float* running_max = vbuf + D;         // [G]
  float* denominator = running_max + G;  // [G]
  for (int64_t g = 0; g < G; ++g) {
    const T* qh = q + (kv * G + g) * L.q_head;
    for (int64_t d = 0; d < D; ++d) qf[g * D + d] = static_cast<float>(qh[d]) * scale;
    running_max[g] = -std::numeric_limits<float>::infinity();
    denominator[g] = 0.0f;
  }
  const T* vrow[kTile];
  int64_t block = 0, offset = 0;  // position p0 + i is slot `offset` of table entry `block`
  for (int64_t p0 = 0; p0 < context; p0 += kTile) {
    const int64_t n = context - p0 < kTile ? context - p0 : kTile;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = table[block * L.table_block] * L.cache_block + offset * L.cache_slot + kv * L.cache_head;
      if (++offset == L.block_size) offset = 0, ++block;
      const float* k = as_float(key_cache + at, D, kbuf + i * D);
      vrow[i] = value_cache + at;
      for (int64_t g = 0; g < G; ++g) {  // each K row read once for the whole group
        const float* qg = qf + g * D;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t d = 0; d < D; ++d) sum += qg[d] * k[d];
        logits[g * kTile + i] = sum;
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      float* lg = logits + g * kTile;
      float tile_max = lg[0];
      for (int64_t i = 1; i < n; ++i) tile_max = lg[i] > tile_max ? lg[i] : tile_max;
      const float new_max = tile_max > running_max[g] ? tile_max : running_max[g];
      const float rescale = std::exp(running_max[g] - new_max);  // 0 on the first tile (exp(-inf))
      running_max[g] = new_max;
      denominator[g] *= rescale;
      for (int64_t d = 0; d < D; ++d) acc[g * D + d] *= rescale;
      for (int64_t i = 0; i < n; ++i) lg[i] -= new_max;
      vec_exp::exp_inplace(lg, n);  // csrc/vec_exp.h: 16 at a time
      for (int64_t i = 0; i < n; ++i) denominator[g] += lg[i];
    }
    for (int64_t i = 0; i < n; ++i) {  // each V row read once for the whole group
      const float* v = as_float(vrow[i], D, vbuf);
      for (int64_t g = 0; g < G; ++g) {
        const float w = logits[g * kTile + i];
        float* __restrict__ a = acc + g * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) a[d] += w * v[d];
      }
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    const float inv = context > 0 ? 1.0f / denominator[g] : 0.0f;  // an empty context gives zeros
    T* o = out + (kv * G + g) * D;
    for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(acc[g * D + d] * inv);
  }
}

// Every (sequence, KV head) of the batch, shared out among threads.
template <typename T>
void run(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache, const int32_t* tables,
         const int32_t* lens, const Layout& L, float scale, at::Tensor& out) {
  const int64_t num_kv_heads = key_cache.size(2), num_heads = q.size(1);
  const T *qp = q.data_ptr<T>(), *kp = key_cache.data_ptr<T>(), *vp = value_cache.data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, q.size(0) * num_kv_heads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s = t / num_kv_heads, kv = t % num_kv_heads;
      const T* qs = qp + s * L.q_seq;
      const int32_t* table = tables + s * L.table_seq;
      T* os = op + s * num_heads * L.dim;
      if (L.dim == 64)
        attend<T, 64>(qs, kp, vp, table, lens[s], kv, L, scale, os);
      else if (L.dim == 128)
        attend<T, 128>(qs, kp, vp, table, lens[s], kv, L, scale, os);
      else
        attend<T, 0>(qs, kp, vp, table, lens[s], kv, L, scale, os);
    }
  });
}

at::Tensor paged_attention_decode(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale) {
  TORCH_CHECK(query.dim() == 3, "paged_attention_decode: query must be [num_seqs, num_heads, head_dim], got ", query.sizes());
  TORCH_CHECK(key_cache.dim() == 4 && value_cache.sizes() == key_cache.sizes(),
              "paged_attention_decode: key_cache and value_cache must both be [num_blocks, block_size, num_kv_heads, head_dim], got ",
              key_cache.sizes(), " and ", value_cache.sizes());
  const int64_t S = query.size(0), H = query.size(1), D = query.size(2);
  const int64_t Hkv = key_cache.size(2);
  TORCH_CHECK(key_cache.size(3) == D, "paged_attention_decode: query has head_dim ", D, " but the caches ", key_cache.size(3));
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, "paged_attention_decode: num_heads (", H, ") must be a multiple of num_kv_heads (", Hkv, ")");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == S && block_tables.scalar_type() == at::kInt,
              "paged_attention_decode: block_tables must be [num_seqs, max_blocks] int32 with num_seqs = ", S, ", got ",
              block_tables.sizes(), " ", block_tables.scalar_type());
  TORCH_CHECK(context_lens.dim() == 1 && context_lens.size(0) == S && context_lens.scalar_type() == at::kInt,
              "paged_attention_decode: context_lens must be [num_seqs] int32 with num_seqs = ", S);
  TORCH_CHECK(query.scalar_type() == key_cache.scalar_type() && value_cache.scalar_type() == key_cache.scalar_type(),
              "paged_attention_decode: query and caches must share one dtype");
  TORCH_CHECK(query.scalar_type() == at::kFloat || query.scalar_type() == at::kBFloat16,
              "paged_attention_decode: float32 or bfloat16 only, got ", query.scalar_type());
  for (const at::Tensor* t : {&query, &key_cache, &value_cache, &block_tables, &context_lens})
    TORCH_CHECK(t->device().is_cpu(), "paged_attention_decode: CPU tensors only");
  TORCH_CHECK(key_cache.strides() == value_cache.strides() && key_cache.stride(3) == 1,
              "paged_attention_decode: the caches must share strides, head_dim contiguous");
  const at::Tensor q = query.stride(2) == 1 ? query : query.contiguous();
  const at::Tensor lens = context_lens.contiguous();
  const int64_t block_size = key_cache.size(1), max_blocks = block_tables.size(1);
  const int32_t* lp = lens.data_ptr<int32_t>();
  for (int64_t s = 0; s < S; ++s)
    TORCH_CHECK(lp[s] >= 0 && lp[s] <= max_blocks * block_size, "paged_attention_decode: context_lens[", s, "] = ", lp[s],
                " does not fit in a table of ", max_blocks, " blocks of ", block_size);
  const int32_t* tp = block_tables.data_ptr<int32_t>();
  const int64_t num_blocks = key_cache.size(0);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t b = 0; b < (lp[s] + block_size - 1) / block_size; ++b) {
      const int32_t id = tp[s * block_tables.stride(0) + b * block_tables.stride(1)];
      TORCH_CHECK(id >= 0 && id < num_blocks, "paged_attention_decode: block_tables[", s, "][", b, "] = ", id, " is not a block of the pool (",
                  num_blocks, " blocks)");
    }
  at::Tensor out = at::empty({S, H, D}, q.options().memory_format(at::MemoryFormat::Contiguous));
  if (S == 0 || H == 0 || D == 0) return out.zero_();
  const Layout L{block_size, H / Hkv, D, key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
                 q.stride(0), q.stride(1), block_tables.stride(0), block_tables.stride(1)};
  const float sc = static_cast<float>(scale);
  if (q.scalar_type() == at::kFloat)
    run<float>(q, key_cache, value_cache, tp, lp, L, sc, out);
  else
    run<c10::BFloat16>(q, key_cache, value_cache, tp, lp, L, sc, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pagedattention_lab, m) {
  m.def("paged_attention_decode(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_tables, Tensor context_lens, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(pagedattention_lab, CPU, m) { m.impl("paged_attention_decode", &paged_attention_decode); }
