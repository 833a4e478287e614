// y = x @ weight.T on CPU, written for decode-sized batches: x [M, K] with M small (one row per running
// request), weight [N, K] (nn.Linear's layout), float32, or bfloat16 on CPUs with AVX512-BF16. Prefills
// (hundreds of rows) go through it too: the same loop, every panel read by all row groups in turn, was
// 1.5-1.7x faster than MKL's sgemm at 128-2,000 rows on an AMD Zen 5 (MKL takes a slower path on AMD CPUs).
//
// Why it exists: in a decode step every weight matrix is read from memory once and used for only a
// few rows, so the step is bound by memory traffic (1-8 rows) or by arithmetic (8-64 rows), and a
// general GEMM (MKL's sgemm) pays for more than either: it copies ("packs") the weight into its own
// layout on every call, which costs the whole traffic again; on this project's 2-core machines that
// took 1.4-4x the time of this kernel for 4-16 rows (`python -m engine bench-cpu`).
//
// So the engine packs each weight once, at load (pack_weight), into panels of 16 output columns:
//     packed[p, k, j] = weight[16 p + j, k]      ([ceil(N / 16), K, 16]; the last panel padded with 0)
// A panel is one contiguous stretch of K x 64 bytes, and one cache line holds the 16 weights of one k.
// The multiply is then an outer product per k, in registers:
//     for each k: w = the panel's 16 weights of k (one vector load);
//                 for each row m: acc[m] += broadcast(x[m, k]) * w     (one fused multiply-add)
// - up to kMaxRows = 16 rows at once (AVX-512; 6 with AVX2): 16 vector accumulators of 16 output columns each, so every
//   weight loaded is used for 16 multiply-adds, and no horizontal sums are needed at the end (each
//   lane of acc[m] is one output y[m, 16 p + lane]: the accumulators are simply stored). Batches of
//   more than 16 rows are cut into balanced groups (40 rows: 14 + 13 + 13) that read the same panel,
//   which stays in L1/L2 cache between them; while they do, the next panel is fetched into L2 (Ahead,
//   below), so that the memory keeps streaming through the later groups' passes too;
// - x is read in place: for each k, one value of each row (16 rows: 16 cache lines, each used for 16 k's);
// - panels are shared out among threads in contiguous ranges, so each thread streams its part of the
//   packed weight from start to end, and the line kPrefetch k's ahead is prefetched (into L1) while
//   the arithmetic runs, so that reading memory overlaps with it. From kPrefetchL2Rows = 6 rows on,
//   the line kPrefetchL2 = 128 k's (8 KB) ahead is also prefetched into L2: with 6-16 multiply-adds
//   per line, 32 lines ahead is too short a lead to hide the memory's latency, and without the far
//   prefetch a step's matmuls took about the sum of their memory time and their arithmetic time
//   instead of the larger of the two (all of SmolLM2-135M's matmuls, one process, alternating builds:
//   8 rows 22.4 -> 19.3 ms, 12 rows 24.6 -> 18.0 ms, 16 rows 29.0 -> 25.2 ms). Below 6 rows the
//   extra prefetch only costs (4 rows: 13.2 against 15.6 ms with it), so it is left out there;
// - each y[m, n] is a plain sequential sum over k in fp32 (one chain per output, as in the textbook
//   definition); its error against the float64 product is within a few times MKL's (tested).
// This is the layout and loop of a BLIS/GotoBLAS micro-kernel (an MR x NR register tile fed by a packed
// weight panel), with the packing done once instead of per call: the weights do not change between
// steps. vLLM's CPU backend gets the same effect from oneDNN's pre-packed weights.
// In bfloat16 (x and weight both bf16, AVX512-BF16) a panel holds pairs of k:
//     packed[p, k / 2, 2 j + k % 2] = weight[16 p + j, k]          ([ceil(N / 16), ceil(K / 2), 32])
// and _mm512_dpbf16_ps adds, in each fp32 lane j, x[m, k] w[j, k] + x[m, k + 1] w[j, k + 1]: half the
// bytes of fp32 per weight; the fp32 sums are rounded to bf16 once at the end.
//
// Built on first use by engine/cpu/ops.py (torch.utils.cpp_extension) for one ISA, and written once against
// csrc/simd.h's vector: with AVX-512 a panel row is one zmm vector and the tile 16 rows (16 accumulators
// of 32 registers); with AVX2 two ymm vectors and 6 rows (12 accumulators of 16 registers: BLIS's Haswell
// sgemm tile, 6 x 16), the same packed panels. Both stream the weights at the memory limit (the avx2 build
// within noise of the avx512 one on one Xeon, 1-16 rows). The generic build (SSE2, NEON: 4 floats) is
// correct but slower than MKL, and the engine multiplies with F.linear there (small_batch_linear_simd()
// says which ISA was built).

#include <ATen/core/Tensor.h>  // not ATen/ATen.h, which declares every operator: a third of a build's time
#include <ATen/ops/empty.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "simd.h"

namespace {

constexpr int64_t kLanes = 16;    // output columns per panel: one AVX-512 vector, two AVX2 ones, four SSE/NEON ones
constexpr int kVecs = kLanes / simd::kWidth;  // vectors per panel row
// Rows of x per register tile: MR x kVecs accumulators, plus the panel row's kVecs vectors and one broadcast
// of x, within the registers: 16 x 1 of AVX-512's 32; 6 x 2 of AVX2's 16 (BLIS's Haswell sgemm tile, 6 x 16);
// 3 x 4 of SSE's 16.
#if defined(__AVX512F__)
constexpr int kMaxRows = 16;
constexpr int kAccumulators = 16;
#elif defined(PAGEDATTENTION_LAB_AVX2)
constexpr int kMaxRows = 6;
constexpr int kAccumulators = 12;
#else
constexpr int kMaxRows = 3;
constexpr int kAccumulators = 12;
#endif
constexpr int64_t kPrefetch = 32; // prefetch the panel's line this many k's (cache lines) ahead
constexpr int64_t kPrefetchL2 = 128;  // and, from kPrefetchL2Rows rows on, this many lines ahead into L2
constexpr int kPrefetchL2Rows = kMaxRows < 6 ? kMaxRows : 6;

// The next panel, fetched into L2 while this one is multiplied by more than one row group. Only the
// first group's pass over a panel reads it from memory; the later passes read it from L1/L2, and without
// this the memory would sit idle through them: a step's matmuls would take the sum of their memory time
// and their arithmetic time, not the larger. So pass g of G fetches the g-th of G consecutive stretches
// of the next panel, one line every G k's: the whole panel once over the G passes, in order, at an even
// pace. next is null with one group (its pass streams its own panel, see kPrefetchL2).
// All of SmolLM2-135M's matmuls in a decode step (`python -m engine bench-cpu`, medians of 7, builds
// alternated, 2-core Xeon): avx2 (6-row groups) 8 rows 27.7 -> 23.7 ms, 12 rows 28.9 -> 26.7, 16 rows
// 33.5 -> 29.6, 32 rows 52.5 -> 45.9; avx512 (16-row groups) 32 rows 43.3 -> 41.0, 64 rows 77.2 -> 70.9.
// Fetching every G-th line of the whole next panel instead (line k in pass k % G) was slower than not
// fetching ahead at all at 8-12 rows (8 rows 27.5 -> 28.6 ms), though it fetches as many lines.
struct Ahead {
  const char* next = nullptr;  // the first line of this pass's stretch
  int64_t line_bytes = 0, lines = 0, passes = 1;
  bool fetched = false;  // this panel was fetched so, while the one before it was multiplied
};

// y[m, 0:cols] = sum over k of x[m, k] * panel[k, 0:cols], for the MR rows of x at `x` (ldx apart).
// With few rows, even and odd k go to two sets of accumulators (added at the end), as long as both fit:
// one chain of dependent multiply-adds per output would wait on each one's latency (4 cycles).
template <int MR>
void tile_f32(const float* x, int64_t ldx, const float* panel, int64_t K, float* y, int64_t ldy, int64_t cols, const Ahead& ahead) {
  using simd::vfloat;
  constexpr int S = 2 * MR * kVecs <= kAccumulators ? 2 : 1;  // accumulator sets
  vfloat acc[S][MR][kVecs];
  for (int s = 0; s < S; ++s)
    for (int m = 0; m < MR; ++m)
      for (int v = 0; v < kVecs; ++v) acc[s][m][v] = simd::zero();
  int64_t due = ahead.next != nullptr && ahead.lines > 0 ? 0 : -1, line = 0;  // when to fetch the stretch's next line (-1: never)
  int64_t k = 0;
  for (; k + S <= K; k += S) {
#pragma GCC unroll 2
    for (int s = 0; s < S; ++s) {
      __builtin_prefetch(panel + (k + s + kPrefetch) * kLanes, 0, 3);  // a prefetch never faults, even past the end
      if (MR >= kPrefetchL2Rows && !ahead.fetched) __builtin_prefetch(panel + (k + s + kPrefetchL2) * kLanes, 0, 2);
      if (k + s == due) {  // the stretch's next line, every passes-th k
        __builtin_prefetch(ahead.next + line++ * ahead.line_bytes, 0, 2);
        due = line < ahead.lines ? due + ahead.passes : -1;
      }
      vfloat w[kVecs];
      for (int v = 0; v < kVecs; ++v) w[v] = simd::load(panel + (k + s) * kLanes + v * simd::kWidth);
#pragma GCC unroll 16
      for (int m = 0; m < MR; ++m) {
        const vfloat xm = simd::set1(x[m * ldx + k + s]);
        for (int v = 0; v < kVecs; ++v) acc[s][m][v] = simd::fmadd(xm, w[v], acc[s][m][v]);
      }
    }
  }
  for (; k < K; ++k) {  // an odd K's last term
    vfloat w[kVecs];
    for (int v = 0; v < kVecs; ++v) w[v] = simd::load(panel + k * kLanes + v * simd::kWidth);
    for (int m = 0; m < MR; ++m)
      for (int v = 0; v < kVecs; ++v) acc[0][m][v] = simd::fmadd(simd::set1(x[m * ldx + k]), w[v], acc[0][m][v]);
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kVecs; ++v) {
      vfloat sum = acc[0][m][v];
      for (int s = 1; s < S; ++s) sum = sum + acc[s][m][v];
      const int64_t lanes = cols - v * simd::kWidth;  // cols = 16 but in the last, padded panel
      if (lanes >= simd::kWidth)
        simd::store(y + m * ldy + v * simd::kWidth, sum);
      else if (lanes > 0)
        simd::store_first(y + m * ldy + v * simd::kWidth, sum, static_cast<int>(lanes));
    }
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
// The same in bf16: x2[m, kp] holds x[m, 2 kp] and x[m, 2 kp + 1] (one 32-bit pair); panel [Kp, 32] bf16.
template <int MR>
void tile_bf16(const int32_t* x2, int64_t ldx, const c10::BFloat16* panel, int64_t Kp, c10::BFloat16* y, int64_t ldy, int64_t cols, const Ahead& ahead) {
  constexpr int S = MR <= 8 ? 2 : 1;  // accumulator sets, as in tile_f32
  __m512 acc[S][MR];
  for (int s = 0; s < S; ++s)
    for (int m = 0; m < MR; ++m) acc[s][m] = _mm512_setzero_ps();
  int64_t due = ahead.next != nullptr && ahead.lines > 0 ? 0 : -1, line = 0;
  int64_t k = 0;
  for (; k + S <= Kp; k += S) {
#pragma GCC unroll 2
    for (int s = 0; s < S; ++s) {
      __builtin_prefetch(panel + (k + s + kPrefetch) * 2 * kLanes, 0, 3);
      if (MR >= kPrefetchL2Rows && !ahead.fetched) __builtin_prefetch(panel + (k + s + kPrefetchL2) * 2 * kLanes, 0, 2);
      if (k + s == due) {  // the stretch's next line, every passes-th k
        __builtin_prefetch(ahead.next + line++ * ahead.line_bytes, 0, 2);
        due = line < ahead.lines ? due + ahead.passes : -1;
      }
      const __m512bh w = (__m512bh)_mm512_loadu_si512(panel + (k + s) * 2 * kLanes);
#pragma GCC unroll 16
      for (int m = 0; m < MR; ++m) acc[s][m] = _mm512_dpbf16_ps(acc[s][m], (__m512bh)_mm512_set1_epi32(x2[m * ldx + k + s]), w);
    }
  }
  for (; k < Kp; ++k) {
    const __m512bh w = (__m512bh)_mm512_loadu_si512(panel + k * 2 * kLanes);
    for (int m = 0; m < MR; ++m) acc[0][m] = _mm512_dpbf16_ps(acc[0][m], (__m512bh)_mm512_set1_epi32(x2[m * ldx + k]), w);
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
  for (int m = 0; m < MR; ++m) {
    __m512 sum = acc[0][m];
    for (int s = 1; s < S; ++s) sum = _mm512_add_ps(sum, acc[s][m]);
    _mm256_mask_storeu_epi16(y + m * ldy, mask, (__m256i)_mm512_cvtneps_pbh(sum));
  }
}
#endif

template <typename X, typename W, typename Y>
using TileFn = void (*)(const X*, int64_t, const W*, int64_t, Y*, int64_t, int64_t, const Ahead&);

// One function per row count (the accumulators are registers only when MR is a constant).
#if defined(__AVX512F__)
#define PAGEDATTENTION_LAB_TILES(FN)                                                                  \
  FN<1>, FN<2>, FN<3>, FN<4>, FN<5>, FN<6>, FN<7>, FN<8>, FN<9>, FN<10>, FN<11>, FN<12>, FN<13>, FN<14>, \
      FN<15>, FN<16>
#elif defined(PAGEDATTENTION_LAB_AVX2)
#define PAGEDATTENTION_LAB_TILES(FN) FN<1>, FN<2>, FN<3>, FN<4>, FN<5>, FN<6>
#else
#define PAGEDATTENTION_LAB_TILES(FN) FN<1>, FN<2>, FN<3>
#endif

// One weight of a multiply: its packed panels and its output y [M, N].
template <typename W, typename Y>
struct Part {
  const W* packed;
  int64_t panels, N;
  Y* y;
};

// All M rows of x ([M, K'] row-major) times every panel of every part (weights of the same K, read by
// the same x), the parts' panels shared out among threads as one range: a thread's contiguous share
// runs on from one weight into the next, with no join between them (q, k and v; gate and up).
template <typename X, typename W, typename Y>
void multiply(const X* x, int64_t M, const std::vector<Part<W, Y>>& parts, int64_t K, int64_t panel_elems, const TileFn<X, W, Y>* tiles) {
  const int64_t groups = (M + kMaxRows - 1) / kMaxRows;
  const int64_t base = M / groups, extra = M % groups;  // the first `extra` groups take one row more
  int64_t total = 0;
  for (const auto& part : parts) total += part.panels;
  at::parallel_for(0, total, 1, [&](int64_t p0, int64_t p1) {
    size_t i = 0;
    int64_t first = 0;  // the global index of parts[i]'s first panel
    for (int64_t q = p0; q < p1; ++q) {
      while (q - first >= parts[i].panels) first += parts[i++].panels;
      const Part<W, Y>& part = parts[i];
      const int64_t p = q - first, N = part.N;
      const int64_t cols = N - p * kLanes < kLanes ? N - p * kLanes : kLanes;
      const W* next = nullptr;  // the panel this thread multiplies next (in this weight or the next one), while groups > 1
      if (groups > 1 && q + 1 < p1) next = p + 1 < part.panels ? part.packed + (p + 1) * panel_elems : parts[i + 1].packed;
      const int64_t stretch = (K + groups - 1) / groups;  // lines (k's) of the next panel per pass
      Ahead ahead;
      ahead.line_bytes = panel_elems / K * static_cast<int64_t>(sizeof(W));
      ahead.passes = groups;
      ahead.fetched = groups > 1 && q > p0;
      int64_t m = 0;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t rows = base + (g < extra ? 1 : 0);
        if (next != nullptr) {
          ahead.next = reinterpret_cast<const char*>(next) + g * stretch * ahead.line_bytes;
          ahead.lines = std::max<int64_t>(0, std::min(stretch, K - g * stretch));
        }
        tiles[rows - 1](x + m * K, K, part.packed + p * panel_elems, K, part.y + m * N + p * kLanes, N, cols, ahead);
        m += rows;
      }
    }
  });
}

bool small_batch_linear_bf16() {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

// The packed shape of an [N, K] weight: [ceil(N / 16), K, 16] in float32, [ceil(N / 16), ceil(K / 2), 32] in bf16.
std::vector<int64_t> packed_shape(int64_t N, int64_t K, bool bf16) {
  const int64_t panels = (N + kLanes - 1) / kLanes;
  return bf16 ? std::vector<int64_t>{panels, (K + 1) / 2, 2 * kLanes} : std::vector<int64_t>{panels, K, kLanes};
}

void check_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2, "pack_weight: weight must be 2-D [N, K], got ", weight.dim(), "-D");
  TORCH_CHECK(weight.device().is_cpu(), "pack_weight: CPU tensors only");
  TORCH_CHECK(weight.scalar_type() == at::kFloat || (weight.scalar_type() == at::kBFloat16 && small_batch_linear_bf16()),
              small_batch_linear_bf16() ? "pack_weight: float32 or bfloat16 only"
                                        : "pack_weight: float32 only (bfloat16 needs a CPU with AVX512-BF16)");
}

// The copy itself, on the elements' bits: `pair` k's per packed row (1 in fp32, 2 in bf16); the output
// is written in order, each of a panel's 16 weight rows read front to back.
template <typename E>
void pack_panels(const E* src, int64_t N, int64_t K, int64_t pair, E* dst) {
  const int64_t panels = (N + kLanes - 1) / kLanes, rows = (K + pair - 1) / pair, width = kLanes * pair;
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t cols = N - p * kLanes < kLanes ? N - p * kLanes : kLanes;
      E* out = dst + p * rows * width;
      for (int64_t r = 0; r < rows; ++r, out += width)
        for (int64_t j = 0; j < kLanes; ++j)
          for (int64_t i = 0; i < pair; ++i) {
            const int64_t k = r * pair + i;
            out[j * pair + i] = j < cols && k < K ? src[(p * kLanes + j) * K + k] : E{0};  // 0: the padding
          }
    }
  });
}

// packed <- weight in panels (see the top of this file); packed must have packed_shape and weight's dtype.
void pack_weight_into(const at::Tensor& weight, at::Tensor& packed) {
  check_weight(weight);
  const int64_t N = weight.size(0), K = weight.size(1);
  const bool bf16 = weight.scalar_type() == at::kBFloat16;
  TORCH_CHECK(packed.sizes() == at::IntArrayRef(packed_shape(N, K, bf16)) && packed.is_contiguous() &&
                  packed.scalar_type() == weight.scalar_type() && packed.device().is_cpu(),
              "pack_weight: out must be a contiguous ", weight.scalar_type(), " CPU tensor of shape ", at::IntArrayRef(packed_shape(N, K, bf16)),
              ", got ", packed.sizes());
  const at::Tensor w = weight.contiguous();
  if (bf16)
    pack_panels(reinterpret_cast<const uint16_t*>(w.data_ptr()), N, K, 2, reinterpret_cast<uint16_t*>(packed.data_ptr()));
  else
    pack_panels(reinterpret_cast<const uint32_t*>(w.data_ptr()), N, K, 1, reinterpret_cast<uint32_t*>(packed.data_ptr()));
}

}  // namespace

// The entry points, declared in ops.h (decode_layer.cpp calls them without the dispatcher).
namespace pagedattention_lab {

void pack_weight_(const at::Tensor& weight, at::Tensor packed) { pack_weight_into(weight, packed); }

std::vector<at::Tensor> small_batch_linears(const at::Tensor& x, at::TensorList packed, at::IntArrayRef ns) {
  TORCH_CHECK(x.dim() == 2, "small_batch_linear: x must be 2-D [M, K], got ", x.dim(), "-D");
  TORCH_CHECK(packed.size() == ns.size() && !packed.empty(), "small_batch_linear: one N per packed weight, at least one; got ", packed.size(),
              " weights and ", ns.size(), " Ns");
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const int64_t M = x.size(0), K = x.size(1);
  for (size_t i = 0; i < packed.size(); ++i) {
    const at::Tensor& w = packed[i];
    TORCH_CHECK(w.dim() == 3 && w.is_contiguous(), "small_batch_linear: packed must be a contiguous weight from pack_weight");
    TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "small_batch_linear: CPU tensors only");
    TORCH_CHECK(x.scalar_type() == w.scalar_type(), "small_batch_linear: x is ", x.scalar_type(), " but the weight is ", w.scalar_type());
    check_weight(x);
    TORCH_CHECK(w.sizes() == at::IntArrayRef(packed_shape(ns[i], K, bf16)),
                "small_batch_linear: x is [M, ", K, "] but the packed weight ", w.sizes(), " is not that of an [", ns[i], ", ", K, "] weight");
  }
  std::vector<at::Tensor> ys;
  for (const int64_t n : ns) ys.push_back(at::empty({M, n}, x.options()));
  if (M == 0) return ys;
  if (K == 0) {
    for (auto& y : ys) y.zero_();
    return ys;
  }
  const int64_t panel_elems = packed[0].size(1) * packed[0].size(2);
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  if (bf16) {
    const at::Tensor x2 = (K % 2 ? at::constant_pad_nd(x, {0, 1}) : x.contiguous()).view(at::kInt);  // [M, ceil(K / 2)] pairs
    static const TileFn<int32_t, c10::BFloat16, c10::BFloat16> tiles[] = {PAGEDATTENTION_LAB_TILES(tile_bf16)};
    std::vector<Part<c10::BFloat16, c10::BFloat16>> parts;
    for (size_t i = 0; i < packed.size(); ++i)
      parts.push_back({packed[i].data_ptr<c10::BFloat16>(), packed[i].size(0), ns[i], ys[i].data_ptr<c10::BFloat16>()});
    multiply(x2.data_ptr<int32_t>(), M, parts, packed[0].size(1), panel_elems, tiles);
    return ys;
  }
#endif
  const at::Tensor xc = x.contiguous();
  static const TileFn<float, float, float> tiles[] = {PAGEDATTENTION_LAB_TILES(tile_f32)};
  std::vector<Part<float, float>> parts;
  for (size_t i = 0; i < packed.size(); ++i) parts.push_back({packed[i].data_ptr<float>(), packed[i].size(0), ns[i], ys[i].data_ptr<float>()});
  multiply(xc.data_ptr<float>(), M, parts, K, panel_elems, tiles);
  return ys;
}

at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N) {
  return small_batch_linears(x, {packed}, {N})[0];
}

std::string small_batch_linear_simd() { return simd::kIsa; }

}  // namespace pagedattention_lab

TORCH_LIBRARY(pagedattention_lab, m) {
  m.def("pack_weight_(Tensor weight, Tensor(a!) packed) -> ()");
  m.def("small_batch_linear(Tensor x, Tensor packed, int n) -> Tensor");
  m.def("small_batch_linears(Tensor x, Tensor[] packed, int[] ns) -> Tensor[]");
  m.def("small_batch_linear_simd() -> str", &pagedattention_lab::small_batch_linear_simd);  // no tensors: no dispatch key needed
  m.def("small_batch_linear_bf16() -> bool", &small_batch_linear_bf16);
}

TORCH_LIBRARY_IMPL(pagedattention_lab, CPU, m) {
  m.impl("pack_weight_", &pagedattention_lab::pack_weight_);
  m.impl("small_batch_linear", &pagedattention_lab::small_batch_linear);
  m.impl("small_batch_linears", &pagedattention_lab::small_batch_linears);
}
