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
//     for the default model), each writing its own output rows;
//   - with AVX-512 and head_dim 64 or 128, attend_avx512 below does the same in registers, 16 positions
//     at a time (8 sequences of 128 tokens, 30 layers, each on its own pool: 4.15 -> 2.99 ms; hot in
//     cache 1.96 -> 0.93 ms; throwaway harness alternating the two on the 2-core EPYC); attend() is
//     the portable version, for other head sizes and CPUs without AVX-512;
//   - a thread runs its tasks in order, a sequence's KV heads one after another: the first KV head's
//     task reads whole slots from memory and the others find them in L2. While a thread runs one
//     sequence's tasks, each also brings a share of the *next* sequence's slots (up to kAheadBytes)
//     into L2, spread over its positions, so that reading memory overlaps with the arithmetic instead
//     of coming all at once in the next first task (16 sequences x 100 tokens, 30 layers on their own
//     pools: 5.96 -> 5.03 ms, 8 x 100: 3.14 -> 2.72 ms, 4 x 150: 2.25 -> 2.17 ms; throwaway harness,
//     alternating the two). Prefetches only: the same results, bit for bit.
//
// Built with the other CPU kernels by engine/cpu_ops.py. Inference only: no autograd.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "ops.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "vec_exp.h"

namespace {

constexpr int64_t kTile = 32;  // positions per online-softmax step
constexpr int64_t kAheadBytes = 256 * 1024;  // K and V of the next sequence brought into L2 ahead (of L2's 1-2 MB)
#if defined(__AVX512F__)
constexpr bool kAhead = true;  // attend_avx512 brings them in; the portable attend does not
#else
constexpr bool kAhead = false;
#endif

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

// Slots of the sequence a thread runs next, to bring into L2 while it runs the current one's later KV
// heads (see run): rows[i] is the element offset of a slot (KV head 0) in the caches, `lines` the cache
// lines of one slot's K (and as many of its V).
struct Ahead {
  const int64_t* rows = nullptr;
  int64_t count = 0, lines = 0;
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

#if defined(__AVX512F__)
// The same attention with AVX-512, for head_dim 64 or 128, in registers. Per tile of 16 positions:
//   - logits: each K row is loaded once (D / 16 vectors) and multiplied with the GC query heads of a
//     chunk of the group, giving one vector of 16 partial sums per (head, position); sum16 then adds
//     up 16 such vectors at once into one vector holding the 16 positions' logits (a transpose-and-add
//     tree: 45 shuffles and adds instead of 16 horizontal sums of ~8 steps each);
//   - the softmax step on that vector (exp 16 at a time, positions past the context masked out);
//   - V: each V row is loaded once, and the GC heads' running sums (GC x D / 16 vectors) stay in
//     registers, one multiply-add per vector;
//   - K and V rows of the next tile are prefetched while this one is computed (through the block
//     table: rows are 768 bytes apart within a block and blocks lie anywhere in the pool), and the
//     first KV head's task brings whole slots into L2 for the others (16 sequences x 85 tokens, 30
//     layers on their own pools: 4.0-6.0 -> 3.4-5.0 ms, 15-18% less in each of 7 alternations).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {  // a bf16 is the top half of a float
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// Lane i of the result is the sum of the 16 lanes of v[(i % 4) * 4 + i / 4] (callers store position p's
// partial sums at that index, so that lane p holds position p's logit).
inline __m512 sum16(const __m512* v) {
  __m512 s[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)  // lanes 0-7: half sums of v[2i], 8-15: of v[2i + 1]
    s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int j = 0; j < 4; ++j)  // 128-bit chunk c: quarter sums of v[4j + c]
    u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * j], s[2 * j + 1], 0x88), _mm512_shuffle_f32x4(s[2 * j], s[2 * j + 1], 0xDD));
  for (int k = 0; k < 2; ++k)  // chunk c: two partials of v[8k + c], then two of v[8k + 4 + c]
    w[k] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * k], u[2 * k + 1], 0x44), _mm512_shuffle_ps(u[2 * k], u[2 * k + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));  // lane 4c + r: v[4r + c]
}

// Query heads h0 .. h0 + GC - 1 of one (sequence, KV head); rows[p]: element offset of position p's K/V row.
// slot_lines > 0: also bring that many cache lines from each row's start (every KV head's row of the slot)
// into L2, two tiles ahead.
template <typename T, int D, int GC>
void attend_chunk(const float* qf, const T* key_cache, const T* value_cache, const int64_t* rows, int64_t context, float* out,
                  int64_t slot_lines, int64_t own_from, const Ahead& ahead) {
  constexpr int V = D / 16;  // vectors per row
  constexpr int64_t kLines = D * static_cast<int64_t>(sizeof(T)) / 64;
  __m512 q[GC][V], acc[GC][V];
  for (int g = 0; g < GC; ++g)
    for (int c = 0; c < V; ++c) q[g][c] = _mm512_loadu_ps(qf + g * D + 16 * c), acc[g][c] = _mm512_setzero_ps();
  float running_max[GC], denominator[GC] = {};
  for (int g = 0; g < GC; ++g) running_max[g] = -std::numeric_limits<float>::infinity();
  alignas(64) float partial[GC][16][16];
  alignas(64) float weight[GC][16];
  int64_t ahead_done = 0;
  for (int64_t p0 = 0; p0 < context; p0 += 16) {
    const int n = static_cast<int>(context - p0 < 16 ? context - p0 : 16);
    for (int i = 0; i < n; ++i) {
      if (ahead.count) {  // the next sequence's slots, spread evenly over this task's positions
        for (const int64_t until = (p0 + i + 1) * ahead.count / context; ahead_done < until; ++ahead_done) {
          const char* kn = reinterpret_cast<const char*>(key_cache + ahead.rows[ahead_done]);
          const char* vn = reinterpret_cast<const char*>(value_cache + ahead.rows[ahead_done]);
          for (int64_t l = 0; l < ahead.lines; ++l) __builtin_prefetch(kn + 64 * l, 0, 2), __builtin_prefetch(vn + 64 * l, 0, 2);
        }
      }
      if (slot_lines && p0 + 32 + i < context && p0 + 32 + i >= own_from) {
        const char* kn = reinterpret_cast<const char*>(key_cache + rows[p0 + 32 + i]);
        const char* vn = reinterpret_cast<const char*>(value_cache + rows[p0 + 32 + i]);
        for (int64_t l = 0; l < slot_lines; ++l) __builtin_prefetch(kn + 64 * l, 0, 2), __builtin_prefetch(vn + 64 * l, 0, 2);
      }
      if (p0 + 16 + i < context) {  // the next tile's rows, into L1
        const char* kn = reinterpret_cast<const char*>(key_cache + rows[p0 + 16 + i]);
        const char* vn = reinterpret_cast<const char*>(value_cache + rows[p0 + 16 + i]);
        for (int64_t l = 0; l < kLines; ++l) __builtin_prefetch(kn + 64 * l, 0, 3), __builtin_prefetch(vn + 64 * l, 0, 3);
      }
      const T* k = key_cache + rows[p0 + i];
      __m512 kv[V];
      for (int c = 0; c < V; ++c) kv[c] = load16(k + 16 * c);
      for (int g = 0; g < GC; ++g) {
        __m512 sum = _mm512_mul_ps(q[g][0], kv[0]);
        for (int c = 1; c < V; ++c) sum = _mm512_fmadd_ps(q[g][c], kv[c], sum);
        _mm512_store_ps(partial[g][(i % 4) * 4 + i / 4], sum);
      }
    }
    for (int i = n; i < 16; ++i)
      for (int g = 0; g < GC; ++g) _mm512_store_ps(partial[g][(i % 4) * 4 + i / 4], _mm512_setzero_ps());
    const __mmask16 valid = static_cast<__mmask16>((1u << n) - 1);
    for (int g = 0; g < GC; ++g) {
      const __m512 logits = sum16(reinterpret_cast<const __m512*>(partial[g]));
      const float tile_max = _mm512_mask_reduce_max_ps(valid, logits);
      const float new_max = tile_max > running_max[g] ? tile_max : running_max[g];
      const float rescale = std::exp(running_max[g] - new_max);  // 0 on the first tile (exp(-inf))
      running_max[g] = new_max;
      const __m512 w = _mm512_maskz_mov_ps(valid, vec_exp::exp16(_mm512_sub_ps(logits, _mm512_set1_ps(new_max))));
      denominator[g] = denominator[g] * rescale + _mm512_reduce_add_ps(w);
      _mm512_store_ps(weight[g], w);
      const __m512 r = _mm512_set1_ps(rescale);
      for (int c = 0; c < V; ++c) acc[g][c] = _mm512_mul_ps(acc[g][c], r);
    }
    for (int i = 0; i < n; ++i) {
      const T* v = value_cache + rows[p0 + i];
      __m512 vv[V];
      for (int c = 0; c < V; ++c) vv[c] = load16(v + 16 * c);
      for (int g = 0; g < GC; ++g) {
        const __m512 wb = _mm512_set1_ps(weight[g][i]);
        for (int c = 0; c < V; ++c) acc[g][c] = _mm512_fmadd_ps(wb, vv[c], acc[g][c]);
      }
    }
  }
  for (int g = 0; g < GC; ++g) {
    const __m512 inv = _mm512_set1_ps(context > 0 ? 1.0f / denominator[g] : 0.0f);  // an empty context gives zeros
    for (int c = 0; c < V; ++c) _mm512_storeu_ps(out + g * D + 16 * c, _mm512_mul_ps(acc[g][c], inv));
  }
}

// One (sequence, KV head) with attend_chunk: the group's heads in chunks of at most 256 / D heads
// (4 at head_dim 64, 2 at 128: 16 accumulator vectors, and as many for the queries).
template <typename T, int D>
void attend_avx512(const T* q, const T* key_cache, const T* value_cache, const int32_t* table, int64_t context, int64_t kv,
                   const Layout& L, float scale, T* out, int64_t own_from, const Ahead& ahead) {
  constexpr int kChunk = 256 / D;
  const int64_t G = L.group;
  std::vector<int64_t> rows(context);
  for (int64_t p = 0; p < context; ++p)
    rows[p] = table[(p / L.block_size) * L.table_block] * L.cache_block + (p % L.block_size) * L.cache_slot + kv * L.cache_head;
  std::vector<float> qf(kChunk * D), result(kChunk * D);
  // The first KV head's task also prefetches the other KV heads' rows of each slot (one contiguous
  // stretch per slot) into L2, where the tasks of this sequence's next KV heads, next on the same thread
  // as a rule, find them: memory is then read in whole slots, not in 1-of-3 pieces 768 bytes apart.
  const int64_t lines = kv == 0 ? (L.cache_slot * static_cast<int64_t>(sizeof(T)) + 63) / 64 : 0;
  for (int64_t h0 = 0; h0 < G; h0 += kChunk) {
    const int gc = static_cast<int>(G - h0 < kChunk ? G - h0 : kChunk);
    const Ahead first = h0 == 0 ? ahead : Ahead{};  // brought in once, during the first chunk of heads
    for (int g = 0; g < gc; ++g) {
      const T* qh = q + (kv * G + h0 + g) * L.q_head;
      for (int64_t d = 0; d < D; ++d) qf[g * D + d] = static_cast<float>(qh[d]) * scale;
    }
    switch (gc) {
      case 1: attend_chunk<T, D, 1>(qf.data(), key_cache, value_cache, rows.data(), context, result.data(), lines, own_from, first); break;
      case 2: attend_chunk<T, D, (kChunk >= 2 ? 2 : 1)>(qf.data(), key_cache, value_cache, rows.data(), context, result.data(), lines, own_from, first); break;
      case 3: attend_chunk<T, D, (kChunk >= 3 ? 3 : 1)>(qf.data(), key_cache, value_cache, rows.data(), context, result.data(), lines, own_from, first); break;
      default: attend_chunk<T, D, (kChunk >= 4 ? 4 : 1)>(qf.data(), key_cache, value_cache, rows.data(), context, result.data(), lines, own_from, first); break;
    }
    T* o = out + (kv * G + h0) * D;
    for (int64_t i = 0; i < gc * D; ++i) o[i] = static_cast<T>(result[i]);
  }
}
#endif

// head_dim 64 or 128: the AVX-512 version where it was built, the portable one elsewhere.
template <typename T, int D>
void attend_fast(const T* q, const T* key_cache, const T* value_cache, const int32_t* table, int64_t context, int64_t kv,
                 const Layout& L, float scale, T* out, int64_t own_from, const Ahead& ahead) {
#if defined(__AVX512F__)
  attend_avx512<T, D>(q, key_cache, value_cache, table, context, kv, L, scale, out, own_from, ahead);
#else
  (void)own_from, (void)ahead;
  attend<T, D>(q, key_cache, value_cache, table, context, kv, L, scale, out);
#endif
}

// Every (sequence, KV head) of the batch, shared out among threads.
template <typename T>
void run(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache, const int32_t* tables,
         const int32_t* lens, const Layout& L, float scale, at::Tensor& out) {
  const int64_t num_kv_heads = key_cache.size(2), num_heads = q.size(1);
  const T *qp = q.data_ptr<T>(), *kp = key_cache.data_ptr<T>(), *vp = value_cache.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t slot_lines = (L.cache_slot * static_cast<int64_t>(sizeof(T)) + 63) / 64;
  const int64_t ahead_cap = kAheadBytes / (2 * 64 * slot_lines);  // positions of the next sequence brought in ahead
  at::parallel_for(0, q.size(0) * num_kv_heads, 1, [&](int64_t t0, int64_t t1) {
    std::vector<int64_t> next;          // slots of the next sequence this thread runs
    int64_t next_seq = -1, covered_seq = -1, covered = 0;  // that many of covered_seq's first positions are in L2 already
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s = t / num_kv_heads, kv = t % num_kv_heads;
      const T* qs = qp + s * L.q_seq;
      const int32_t* table = tables + s * L.table_seq;
      T* os = op + s * num_heads * L.dim;
      Ahead ahead;
      if (kAhead && (L.dim == 64 || L.dim == 128) && (s + 1) * num_kv_heads < t1) {  // this thread runs sequence s + 1 next
        const int64_t count = lens[s + 1] < ahead_cap ? lens[s + 1] : ahead_cap;
        if (next_seq != s + 1) {  // the first of these tasks on this thread (a range may start at any KV head)
          next_seq = s + 1;
          const int32_t* next_table = tables + (s + 1) * L.table_seq;
          next.resize(count);
          for (int64_t p = 0; p < count; ++p)
            next[p] = next_table[(p / L.block_size) * L.table_block] * L.cache_block + (p % L.block_size) * L.cache_slot;
        }
        const int64_t a = kv * count / num_kv_heads, b = (kv + 1) * count / num_kv_heads;  // 1 / num_kv_heads of them per task
        ahead = Ahead{next.data() + a, b - a, slot_lines};
        if (kv == num_kv_heads - 1 && s * num_kv_heads >= t0) covered_seq = s + 1, covered = count;  // all its parts brought in
      }
      const int64_t own_from = s == covered_seq ? covered : 0;
      if (L.dim == 64)
        attend_fast<T, 64>(qs, kp, vp, table, lens[s], kv, L, scale, os, own_from, ahead);
      else if (L.dim == 128)
        attend_fast<T, 128>(qs, kp, vp, table, lens[s], kv, L, scale, os, own_from, ahead);
      else
        attend<T, 0>(qs, kp, vp, table, lens[s], kv, L, scale, os);
    }
  });
}

}  // namespace

// The entry points, declared in ops.h (decode_layer.cpp calls them without the dispatcher).
namespace pagedattention_lab {

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

}  // namespace pagedattention_lab

TORCH_LIBRARY_FRAGMENT(pagedattention_lab, m) {
  m.def("paged_attention_decode(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_tables, Tensor context_lens, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(pagedattention_lab, CPU, m) { m.impl("paged_attention_decode", &pagedattention_lab::paged_attention_decode); }
