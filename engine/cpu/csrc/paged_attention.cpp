// Decode attention on CPU that reads K and V in place through the block table (PagedAttention, paper
// §4.1; vLLM's paged_attention_v1, and its CPU backend's, compute the same thing):
//
//   paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale, sliding_window, k_scale, v_scale) -> out
//       query        [num_seqs, num_heads, head_dim]             fp32 or bf16 (may be a strided view)
//       key_cache    [num_blocks, block_size, num_kv_heads, head_dim]   same dtype, or fp8 (e4m3fn, e5m2), head_dim contiguous
//       value_cache  [num_blocks, block_size, num_kv_heads, head_dim]
//       block_tables [num_seqs, max_blocks] int32 (may be a view into a wider table)
//       context_lens [num_seqs] int32, tokens of context (the current token's K and V already written)
//       sliding_window 0: full attention; W > 0: the query (at position context_len - 1) sees its last W
//                    positions only (Hugging Face's and vLLM's window), and table entries of blocks wholly
//                    before them are never read (a hybrid KV cache may have freed those blocks)
//       out          [num_seqs, num_heads, head_dim] in query's dtype; zeros where context_lens == 0
//       k_scale, v_scale  fp8 caches only: a cached byte b stands for fp8(b) * scale (vLLM's per-tensor k/v scales)
//
// fp8 caches (engine/model_executor/kv_quant.py): each byte is widened to fp32 in registers through a
// 256-entry table (AVX-512 and AVX2: one gather of a vector of floats per 16 or 8 bytes), never written back. The scales are
// applied where they cost nothing: q . (k8 * k_scale) = (q * k_scale) . k8, so k_scale joins the softmax
// scale; sum_i w_i (v8_i * v_scale) = v_scale * sum_i w_i v8_i, so v_scale multiplies the output once.
//
// Why: the torch reference (engine/attention.py) first gathers every sequence's K and V into a padded
// copy, then runs SDPA on it: two copies of the whole context per layer and ~10 operator calls. Here
// each (sequence, KV head) is one task that walks its context once:
//   - position p lives at block block_tables[s][p / block_size], offset p % block_size; only
//     positions < context_lens[s] (and, with a window, >= context_lens[s] - sliding_window) are read, so nothing outside a context (stale K/V, NaN) reaches the
//     result, and table entries past a sequence's blocks are never looked at;
//   - grouped-query attention: the num_heads / num_kv_heads query heads that share a KV head are
//     done together, so each K and V row is read from memory once for all of them;
//   - online softmax (Milakov & Gimelshein 2018; FlashAttention): positions come in tiles of kTile;
//     per tile, the logits of every head of the group, their running maximum, and the weighted sum of
//     V rows rescaled when the maximum grows. Everything is accumulated in fp32, whatever the dtype;
//   - tasks are shared out among threads with at::parallel_for (16 sequences x 3 KV heads = 48 tasks
//     for the default model), each writing its own output rows;
//   - with AVX-512 or AVX2 and head_dim 64 or 128, attend_span below does the same in registers, 16 (8)
//     positions at a time (8 sequences of 128 tokens, 30 layers, each on its own pool: 4.15 -> 2.99 ms; hot in
//     cache 1.96 -> 0.93 ms; throwaway harness alternating the two on the 2-core EPYC); attend() is
//     the portable version, for other head sizes and the generic build (no AVX2);
//   - a thread walks its tasks span by span (run_spans): kSpan positions of a sequence for every KV
//     head it runs there, then the next span. The KV heads of a slot lie side by side, so a span's
//     slots are one stretch of memory per slot; while one span is computed, the next one's slots (the
//     rest of this sequence, or the first span of the next sequence the thread runs) are brought into
//     L2, spread evenly over the span's work. Memory is then read at an even pace while the arithmetic
//     runs. Running a sequence's KV heads one after another over the whole context instead (the
//     first reads every slot from memory, the others find them in L2, and only 256 KB of the next
//     sequence comes in ahead) reads long contexts in bursts; against it, span by span (30 layers on
//     their own pools in 2 MiB pages, the two builds alternating, throwaway harness: 8 sequences x
//     ~490 tokens 10.64 -> 8.66 ms, 4 x ~290: 4.03 -> 3.11 ms, 1 x 1000: 3.70 -> 3.02 ms, 16 x ~150:
//     7.22 -> 6.87 ms, 16 x ~50: 3.83 -> 3.68 ms). The same tiles in the same order, with the softmax
//     state carried from span to span: the same results, bit for bit.
//
// Built with the other CPU kernels by engine/cpu_ops.py. Inference only: no autograd.

#include <ATen/core/Tensor.h>  // not ATen/ATen.h, which declares every operator: a third of a build's time
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "ops.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "vec_exp.h"

namespace {

constexpr int64_t kTile = 32;  // positions per online-softmax step
constexpr int64_t kSpan = 64;  // positions per span (a multiple of 16): K and V of a span's slots are brought into L2 one span ahead

// The two fp8 forms of a cached element, one byte each (OCP FP8: e4m3fn, largest 448; e5m2, largest 57344).
struct Fp8E4M3 { uint8_t bits; };
struct Fp8E5M2 { uint8_t bits; };
template <typename C> constexpr bool kIsFp8 = false;
template <> constexpr bool kIsFp8<Fp8E4M3> = true;
template <> constexpr bool kIsFp8<Fp8E5M2> = true;

// Every byte's value as fp32: sign, `E` exponent bits (bias 2^(E-1) - 1), `M` mantissa bits; exponent 0
// is subnormal. e4m3fn has no infinities (only 0x7F/0xFF are NaN); e5m2 follows IEEE (all-ones exponent: inf/NaN).
template <int E, int M, bool kFn>
const float* fp8_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    const int bias = (1 << (E - 1)) - 1;
    for (int b = 0; b < 256; ++b) {
      const int sign = b >> 7, exponent = (b >> M) & ((1 << E) - 1), mantissa = b & ((1 << M) - 1);
      float v;
      if (kFn && exponent == (1 << E) - 1 && mantissa == (1 << M) - 1) v = std::numeric_limits<float>::quiet_NaN();
      else if (!kFn && exponent == (1 << E) - 1) v = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
      else if (exponent == 0) v = std::ldexp(static_cast<float>(mantissa), 1 - bias - M);
      else v = std::ldexp(static_cast<float>((1 << M) + mantissa), exponent - bias - M);
      t[b] = sign ? -v : v;
    }
    return t;
  }();
  return table.data();
}
inline const float* fp8_values(const Fp8E4M3*) { return fp8_table<4, 3, true>(); }
inline const float* fp8_values(const Fp8E5M2*) { return fp8_table<5, 2, false>(); }

// A K or V row as fp32: fp32 rows are used in place, bf16 and fp8 rows are widened into `buffer`.
inline const float* as_float(const float* row, int64_t, float*) { return row; }
inline const float* as_float(const c10::BFloat16* row, int64_t dim, float* buffer) {
  for (int64_t d = 0; d < dim; ++d) buffer[d] = static_cast<float>(row[d]);
  return buffer;
}
template <typename C, typename = std::enable_if_t<kIsFp8<C>>>
inline const float* as_float(const C* row, int64_t dim, float* buffer) {
  const float* values = fp8_values(row);
  for (int64_t d = 0; d < dim; ++d) buffer[d] = values[row[d].bits];
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
// Positions first .. context - 1 are read (first > 0: a sliding window's start).
template <typename T, typename C, int kDim>
void attend(const T* q, const C* key_cache, const C* value_cache, const int32_t* table, int64_t first, int64_t context, int64_t kv,
            const Layout& L, float scale, float v_scale, T* out) {
  const int64_t G = L.group, D = kDim > 0 ? kDim : L.dim;
  std::vector<float> work(2 * G * D + G * kTile + kTile * D + D + 2 * G);
  float* qf = work.data();               // [G, D] the group's queries, scaled
  float* acc = qf + G * D;               // [G, D] running sum of softmax weights x V rows
  float* logits = acc + G * D;           // [G, kTile], then the tile's softmax weights
  float* kbuf = logits + G * kTile;      // [kTile, D] bf16/fp8 K rows widened (unused for fp32)
  float* vbuf = kbuf + kTile * D;        // [D] one bf16/fp8 V row widened
  float* running_max = vbuf + D;         // [G]
  float* denominator = running_max + G;  // [G]
  for (int64_t g = 0; g < G; ++g) {
    const T* qh = q + (kv * G + g) * L.q_head;
    for (int64_t d = 0; d < D; ++d) qf[g * D + d] = static_cast<float>(qh[d]) * scale;
    running_max[g] = -std::numeric_limits<float>::infinity();
    denominator[g] = 0.0f;
  }
  const C* vrow[kTile];
  int64_t block = first / L.block_size, offset = first % L.block_size;  // position p0 + i is slot `offset` of table entry `block`
  for (int64_t p0 = first; p0 < context; p0 += kTile) {
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
      vec_exp::exp_inplace(lg, n);  // csrc/vec_exp.h: a vector at a time
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
    float inv = context > 0 ? 1.0f / denominator[g] : 0.0f;  // an empty context gives zeros
    if constexpr (kIsFp8<C>) inv *= v_scale;
    T* o = out + (kv * G + g) * D;
    for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(acc[g * D + d] * inv);
  }
}

// The first position a decode query sees: 0, or with a sliding window of W, context - W.
inline int64_t window_first(int64_t context, int64_t window) { return window > 0 && context > window ? context - window : 0; }

#if defined(PAGEDATTENTION_LAB_SIMD)
// The same attention a vector at a time (csrc/simd.h: W = 16 floats with AVX-512, 8 with AVX2), for
// head_dim 64 or 128, in registers. Per tile of W positions:
//   - logits: each K row is loaded once (D / W vectors) and multiplied with the GC query heads of a
//     chunk of the group, giving one vector of W partial sums per (head, position); sum_lanes then adds
//     up W such vectors at once into one vector holding the W positions' logits (a transpose-and-add
//     tree: 45 shuffles and adds instead of 16 horizontal sums of ~8 steps each with AVX-512, 8 hadds
//     and one add with AVX2);
//   - the softmax step on that vector (exp W at a time, positions past the context masked out);
//   - V: each V row is loaded once, and the GC heads' running sums (GC x D / W vectors) stay in
//     registers, one multiply-add per vector;
//   - K and V rows of the next tile are prefetched while this one is computed (through the block
//     table: rows are 768 bytes apart within a block and blocks lie anywhere in the pool), and the
//     first KV head's task brings whole slots into L2 for the others (16 sequences x 85 tokens, 30
//     layers on their own pools: 4.0-6.0 -> 3.4-5.0 ms, 15-18% less in each of 7 alternations).
using simd::vfloat;
constexpr int W = simd::kWidth;
inline vfloat load_row(const float* p) { return simd::load(p); }
inline vfloat load_row(const c10::BFloat16* p) { return simd::load(p); }
template <typename C, typename = std::enable_if_t<kIsFp8<C>>>
inline vfloat load_row(const C* p) {  // W fp8 bytes -> W floats: each byte indexes the format's table
  return simd::gather_bytes(reinterpret_cast<const uint8_t*>(p), fp8_values(p));
}

#if defined(__AVX512F__)
// Lane i of the result is the sum of the 16 lanes of v[slot(i)] (callers store position p's partial
// sums at v[slot(p)], so that lane p holds position p's logit).
inline int slot(int i) { return (i % 4) * 4 + i / 4; }
inline __m512 sum_lanes(const __m512* v) {
  __m512 s[8], u[4], w[2];
  for (int i = 0; i < 8; ++i)  // lanes 0-7: half sums of v[2i], 8-15: of v[2i + 1]
    s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int j = 0; j < 4; ++j)  // 128-bit chunk c: quarter sums of v[4j + c]
    u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * j], s[2 * j + 1], 0x88), _mm512_shuffle_f32x4(s[2 * j], s[2 * j + 1], 0xDD));
  for (int k = 0; k < 2; ++k)  // chunk c: two partials of v[8k + c], then two of v[8k + 4 + c]
    w[k] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * k], u[2 * k + 1], 0x44), _mm512_shuffle_ps(u[2 * k], u[2 * k + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));  // lane 4c + r: v[4r + c]
}
#else
// AVX2: lane i of the result is the sum of the 8 lanes of v[i].
inline int slot(int i) { return i; }
inline __m256 sum_lanes(const __m256* v) {
  // hadd pairs neighbours within each 128-bit half: after two rounds, half h of u0 holds v[0..3]'s sums
  // over lanes 4h .. 4h + 3, and u1 v[4..7]'s; the halves are then added across.
  const __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
#endif

// Lines to bring into L2 while a span is computed: `count` slots, each from byte `from` of its row
// start (rows[i], element offsets in the caches) for `lines` cache lines, of K and of V.
struct Prefetch {
  const int64_t* rows = nullptr;
  int64_t count = 0, from = 0, lines = 0;
};

inline void prefetch_slot(const char* k, const char* v, const Prefetch& pf) {
  for (int64_t l = 0; l < pf.lines; ++l) __builtin_prefetch(k + 64 * l, 0, 2), __builtin_prefetch(v + 64 * l, 0, 2);
}

// Query heads h0 .. h0 + GC - 1 of one (sequence, KV head), over positions [begin, end) of its context:
// the online softmax carried on from `acc`, `running_max` and `denominator` (GC x D, GC, GC) and left
// there for the next span; rows[p]: element offset of position p's K/V row; `context` bounds the L1
// prefetch of the next tile. While it runs it also brings pf's slots into L2, spread evenly over its
// positions, and, where `own_lines` > 0 (a span nothing brought in ahead), this span's own slots 32
// positions ahead (lines from byte `own_from` of each rows[p]).
template <typename T, int D, int GC>
void attend_span(const float* qf, const T* key_cache, const T* value_cache, const int64_t* rows, int64_t begin, int64_t end,
                 int64_t context, float* acc_state, float* running_max, float* denominator, const Prefetch& pf, int64_t own_from,
                 int64_t own_lines) {
  constexpr int V = D / W;  // vectors per row
  constexpr int64_t kLines = D * static_cast<int64_t>(sizeof(T)) / 64;
  vfloat q[GC][V], acc[GC][V];
  for (int g = 0; g < GC; ++g)
    for (int c = 0; c < V; ++c) q[g][c] = simd::load(qf + g * D + W * c), acc[g][c] = simd::load(acc_state + g * D + W * c);
  alignas(64) float partial[GC][W][W];
  alignas(64) float weight[GC][W];
  const int64_t span = end - begin;
  int64_t pf_done = 0;
  for (int64_t p0 = begin; p0 < end; p0 += W) {
    const int n = static_cast<int>(end - p0 < W ? end - p0 : W);
    for (int i = 0; i < n; ++i) {
      for (const int64_t until = (p0 - begin + i + 1) * pf.count / span; pf_done < until; ++pf_done) {
        const int64_t at = pf.rows[pf_done];
        prefetch_slot(reinterpret_cast<const char*>(key_cache + at) + pf.from, reinterpret_cast<const char*>(value_cache + at) + pf.from, pf);
      }
      if (own_lines && p0 + 32 + i < end) {
        const int64_t at = rows[p0 + 32 + i];
        const char* kn = reinterpret_cast<const char*>(key_cache + at) + own_from;
        const char* vn = reinterpret_cast<const char*>(value_cache + at) + own_from;
        for (int64_t l = 0; l < own_lines; ++l) __builtin_prefetch(kn + 64 * l, 0, 2), __builtin_prefetch(vn + 64 * l, 0, 2);
      }
      if (p0 + W + i < context) {  // the next tile's rows, into L1
        const char* kn = reinterpret_cast<const char*>(key_cache + rows[p0 + W + i]);
        const char* vn = reinterpret_cast<const char*>(value_cache + rows[p0 + W + i]);
        for (int64_t l = 0; l < kLines; ++l) __builtin_prefetch(kn + 64 * l, 0, 3), __builtin_prefetch(vn + 64 * l, 0, 3);
      }
      const T* k = key_cache + rows[p0 + i];
      vfloat kv[V];
      for (int c = 0; c < V; ++c) kv[c] = load_row(k + W * c);
      for (int g = 0; g < GC; ++g) {
        vfloat sum = q[g][0] * kv[0];
        for (int c = 1; c < V; ++c) sum = simd::fmadd(q[g][c], kv[c], sum);
        simd::store(partial[g][slot(i)], sum);
      }
    }
    for (int i = n; i < W; ++i)
      for (int g = 0; g < GC; ++g) simd::store(partial[g][slot(i)], simd::zero());
    for (int g = 0; g < GC; ++g) {
      const vfloat logits = sum_lanes(reinterpret_cast<const vfloat*>(partial[g]));
      const float tile_max = simd::reduce_max(simd::first_lanes(logits, n, -std::numeric_limits<float>::infinity()));
      const float new_max = tile_max > running_max[g] ? tile_max : running_max[g];
      const float rescale = std::exp(running_max[g] - new_max);  // 0 on the first tile (exp(-inf))
      running_max[g] = new_max;
      const vfloat w = simd::first_lanes(vec_exp::expv(logits - simd::set1(new_max)), n, 0.0f);
      denominator[g] = denominator[g] * rescale + simd::reduce_add(w);
      simd::store(weight[g], w);
      const vfloat r = simd::set1(rescale);
      for (int c = 0; c < V; ++c) acc[g][c] = acc[g][c] * r;
    }
    for (int i = 0; i < n; ++i) {
      const T* v = value_cache + rows[p0 + i];
      vfloat vv[V];
      for (int c = 0; c < V; ++c) vv[c] = load_row(v + W * c);
      for (int g = 0; g < GC; ++g) {
        const vfloat wb = simd::set1(weight[g][i]);
        for (int c = 0; c < V; ++c) acc[g][c] = simd::fmadd(wb, vv[c], acc[g][c]);
      }
    }
  }
  for (; pf_done < pf.count; ++pf_done) {  // a span shorter than 16 x its share: the rest now
    const int64_t at = pf.rows[pf_done];
    prefetch_slot(reinterpret_cast<const char*>(key_cache + at) + pf.from, reinterpret_cast<const char*>(value_cache + at) + pf.from, pf);
  }
  for (int g = 0; g < GC; ++g)
    for (int c = 0; c < V; ++c) simd::store(acc_state + g * D + W * c, acc[g][c]);
}

template <typename T, int D>
using SpanFn = void (*)(const float*, const T*, const T*, const int64_t*, int64_t, int64_t, int64_t, float*, float*, float*,
                        const Prefetch&, int64_t, int64_t);

// rows[i] for `count` positions of a sequence from position `first` on: the element offset of position
// first + i's slot (KV head 0).
inline void slot_rows(const int32_t* table, int64_t first, int64_t count, const Layout& L, std::vector<int64_t>& rows) {
  rows.resize(count);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t p = first + i;
    rows[i] = table[(p / L.block_size) * L.table_block] * L.cache_block + (p % L.block_size) * L.cache_slot;
  }
}

// A thread's tasks t0 .. t1 - 1 (task t = sequence t / num_kv_heads, KV head t % num_kv_heads) with
// AVX-512, head_dim 64 or 128, span by span: for each span of kSpan positions of a sequence, every KV
// head (and chunk of query heads) the thread runs for it, before the next span. While one span is
// computed, the next one's slots (this sequence's next span, or the first span of the next sequence the
// thread runs) are brought into L2, spread over the span's work: memory is then read at an even pace,
// in whole slots (the KV heads of a slot lie side by side), while the arithmetic runs.
// With a sliding window the span walk runs over the window's positions only (rows from its first on).
template <typename T, typename C, int D>
void run_spans(const T* qp, const C* kp, const C* vp, const int32_t* tables, const int32_t* lens, const Layout& L, float scale,
               int64_t window, float v_scale, T* op, int64_t num_kv_heads, int64_t t0, int64_t t1) {
  // Query heads per attend_span call: as many accumulator vectors (and as many for the queries) as the
  // registers hold: 16 of AVX-512's 32, 8 of AVX2's 16 (one head at a time there).
  constexpr int kAccVectors = W == 16 ? 16 : 8;
  constexpr int kChunk = kAccVectors * W / D > 1 ? kAccVectors * W / D : 1;
  const int64_t G = L.group, chunks = (G + kChunk - 1) / kChunk;
  static const SpanFn<C, D> spans[] = {attend_span<C, D, 1>, attend_span<C, D, (kChunk >= 2 ? 2 : 1)>,
                                       attend_span<C, D, (kChunk >= 3 ? 3 : 1)>, attend_span<C, D, (kChunk >= 4 ? 4 : 1)>};
  std::vector<int64_t> rows, next_rows, kv_rows;
  std::vector<float> qf, acc, running_max, denominator;
  int64_t prefetched_seq = -1;  // the sequence whose first span was brought in ahead
  for (int64_t t = t0; t < t1;) {
    const int64_t s = t / num_kv_heads, kv_a = t % num_kv_heads;
    const int64_t kv_b = t1 - s * num_kv_heads < num_kv_heads ? t1 - s * num_kv_heads : num_kv_heads;
    const int64_t heads = (kv_b - kv_a) * G, first = window_first(lens[s], window), context = lens[s] - first;
    slot_rows(tables + s * L.table_seq, first, context, L, rows);
    qf.assign(heads * D, 0.0f), acc.assign(heads * D, 0.0f), denominator.assign(heads, 0.0f);
    running_max.assign(heads, -std::numeric_limits<float>::infinity());
    for (int64_t h = 0; h < heads; ++h) {
      const T* qh = qp + s * L.q_seq + (kv_a * G + h) * L.q_head;
      for (int64_t d = 0; d < D; ++d) qf[h * D + d] = static_cast<float>(qh[d]) * scale;
    }
    const int64_t own_from = kv_a * D * static_cast<int64_t>(sizeof(C));
    const int64_t own_lines = ((kv_b - kv_a) * D * static_cast<int64_t>(sizeof(C)) + 63) / 64;
    kv_rows.resize(context);
    for (int64_t b = 0; b < context; b += kSpan) {
      const int64_t e = context - b < kSpan ? context : b + kSpan;
      // What comes next on this thread: the rest of this sequence, else the next sequence's first span.
      Prefetch next;
      if (e < context) {
        next = Prefetch{rows.data() + e, (context - e < kSpan ? context - e : kSpan), own_from, own_lines};
      } else if ((s + 1) * num_kv_heads < t1 && lens[s + 1] > 0) {
        const int64_t next_first = window_first(lens[s + 1], window), next_context = lens[s + 1] - next_first;
        const int64_t n = next_context < kSpan ? next_context : kSpan;
        const int64_t kv_end = t1 - (s + 1) * num_kv_heads < num_kv_heads ? t1 - (s + 1) * num_kv_heads : num_kv_heads;
        slot_rows(tables + (s + 1) * L.table_seq, next_first, n, L, next_rows);
        next = Prefetch{next_rows.data(), n, 0, (kv_end * D * static_cast<int64_t>(sizeof(C)) + 63) / 64};
        prefetched_seq = s + 1;
      }
      const bool cold = b == 0 && prefetched_seq != s;  // nothing brought this span in: the first KV head fetches it
      const int64_t units = (kv_b - kv_a) * chunks;
      int64_t unit = 0;
      for (int64_t kv = kv_a; kv < kv_b; ++kv) {
        for (int64_t p = b; p < (e + W < context ? e + W : context); ++p) kv_rows[p] = rows[p] + kv * L.cache_head;  // and the next tile's
        for (int64_t h0 = 0; h0 < G; h0 += kChunk, ++unit) {
          const int gc = static_cast<int>(G - h0 < kChunk ? G - h0 : kChunk);
          const int64_t h = (kv - kv_a) * G + h0;
          const int64_t a = unit * next.count / units, z = (unit + 1) * next.count / units;  // this unit's share of the next span
          const Prefetch share{next.rows + a, z - a, next.from, next.lines};
          spans[gc - 1](qf.data() + h * D, kp, vp, kv_rows.data(), b, e, context, acc.data() + h * D, running_max.data() + h,
                        denominator.data() + h, share, 0, cold && unit == 0 ? own_lines : 0);  // kv_rows start at KV head kv_a
        }
      }
    }
    for (int64_t h = 0; h < heads; ++h) {
      float inv = context > 0 ? 1.0f / denominator[h] : 0.0f;  // an empty context gives zeros
      if constexpr (kIsFp8<C>) inv *= v_scale;
      T* o = op + s * (L.group * num_kv_heads) * D + (kv_a * G + h) * D;
      for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(acc[h * D + d] * inv);
    }
    t = s * num_kv_heads + kv_b;
  }
}
#endif

// Every (sequence, KV head) of the batch, shared out among threads in contiguous ranges of tasks.
template <typename T, typename C>
void run(const at::Tensor& q, const at::Tensor& key_cache, const at::Tensor& value_cache, const int32_t* tables,
         const int32_t* lens, const Layout& L, float scale, int64_t window, float v_scale, at::Tensor& out) {
  const int64_t num_kv_heads = key_cache.size(2), num_heads = q.size(1);
  const T* qp = q.data_ptr<T>();
  const C *kp = static_cast<const C*>(key_cache.data_ptr()), *vp = static_cast<const C*>(value_cache.data_ptr());
  T* op = out.data_ptr<T>();
  at::parallel_for(0, q.size(0) * num_kv_heads, 1, [&](int64_t t0, int64_t t1) {
#if defined(PAGEDATTENTION_LAB_SIMD)
    if (L.dim == 64) return run_spans<T, C, 64>(qp, kp, vp, tables, lens, L, scale, window, v_scale, op, num_kv_heads, t0, t1);
    if (L.dim == 128) return run_spans<T, C, 128>(qp, kp, vp, tables, lens, L, scale, window, v_scale, op, num_kv_heads, t0, t1);
#endif
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s = t / num_kv_heads, kv = t % num_kv_heads;
      const T* qs = qp + s * L.q_seq;
      T* os = op + s * num_heads * L.dim;
      const int64_t first = window_first(lens[s], window);
      if (L.dim == 64)
        attend<T, C, 64>(qs, kp, vp, tables + s * L.table_seq, first, lens[s], kv, L, scale, v_scale, os);
      else if (L.dim == 128)
        attend<T, C, 128>(qs, kp, vp, tables + s * L.table_seq, first, lens[s], kv, L, scale, v_scale, os);
      else
        attend<T, C, 0>(qs, kp, vp, tables + s * L.table_seq, first, lens[s], kv, L, scale, v_scale, os);
    }
  });
}

}  // namespace

// The entry points, declared in ops.h (decode_layer.cpp calls them without the dispatcher).
namespace pagedattention_lab {

at::Tensor paged_attention_decode(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale, int64_t sliding_window,
                                  double k_scale, double v_scale) {
  TORCH_CHECK(sliding_window >= 0, "paged_attention_decode: sliding_window must be 0 (full attention) or positive, got ", sliding_window);
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
  const at::ScalarType cache_type = key_cache.scalar_type();
  const bool fp8 = cache_type == at::kFloat8_e4m3fn || cache_type == at::kFloat8_e5m2;
  TORCH_CHECK(value_cache.scalar_type() == cache_type && (fp8 || query.scalar_type() == cache_type),
              "paged_attention_decode: query and caches must share one dtype, or the caches be fp8 of one form (e4m3fn, e5m2); got ", query.scalar_type(),
              ", ", cache_type, " and ", value_cache.scalar_type());
  TORCH_CHECK(!fp8 || (k_scale > 0 && v_scale > 0 && std::isfinite(k_scale) && std::isfinite(v_scale)),
              "paged_attention_decode: k_scale and v_scale must be finite and > 0, got ", k_scale, " and ", v_scale);
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
  for (int64_t s = 0; s < S; ++s)  // the blocks the kernel reads: from the window's first on
    for (int64_t b = window_first(lp[s], sliding_window) / block_size; b < (lp[s] + block_size - 1) / block_size; ++b) {
      const int32_t id = tp[s * block_tables.stride(0) + b * block_tables.stride(1)];
      TORCH_CHECK(id >= 0 && id < num_blocks, "paged_attention_decode: block_tables[", s, "][", b, "] = ", id, " is not a block of the pool (",
                  num_blocks, " blocks)");
    }
  at::Tensor out = at::empty({S, H, D}, q.options().memory_format(at::MemoryFormat::Contiguous));
  if (S == 0 || H == 0 || D == 0) return out.zero_();
  const Layout L{block_size, H / Hkv, D, key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
                 q.stride(0), q.stride(1), block_tables.stride(0), block_tables.stride(1)};
  const bool f32 = q.scalar_type() == at::kFloat;
  if (!fp8) {
    const float sc = static_cast<float>(scale);
    if (f32)
      run<float, float>(q, key_cache, value_cache, tp, lp, L, sc, sliding_window, 1.0f, out);
    else
      run<c10::BFloat16, c10::BFloat16>(q, key_cache, value_cache, tp, lp, L, sc, sliding_window, 1.0f, out);
    return out;
  }
  const float sc = static_cast<float>(scale * k_scale), vs = static_cast<float>(v_scale);  // see the top of this file
  if (cache_type == at::kFloat8_e4m3fn)
    f32 ? run<float, Fp8E4M3>(q, key_cache, value_cache, tp, lp, L, sc, sliding_window, vs, out)
        : run<c10::BFloat16, Fp8E4M3>(q, key_cache, value_cache, tp, lp, L, sc, sliding_window, vs, out);
  else
    f32 ? run<float, Fp8E5M2>(q, key_cache, value_cache, tp, lp, L, sc, sliding_window, vs, out)
        : run<c10::BFloat16, Fp8E5M2>(q, key_cache, value_cache, tp, lp, L, sc, sliding_window, vs, out);
  return out;
}

}  // namespace pagedattention_lab

TORCH_LIBRARY_FRAGMENT(pagedattention_lab, m) {
  m.def("paged_attention_decode(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_tables, Tensor context_lens, float scale, "
        "int sliding_window=0, float k_scale=1.0, float v_scale=1.0) -> Tensor");
}

TORCH_LIBRARY_IMPL(pagedattention_lab, CPU, m) { m.impl("paged_attention_decode", &pagedattention_lab::paged_attention_decode); }
