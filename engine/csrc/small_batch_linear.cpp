// y = x @ weight.T for decode-sized batches on CPU: x [M, K] fp32 with M small (1-64 rows, one per
// running request), weight [N, K] fp32 row-major: nn.Linear's own layout, used as it is.
//
// Why it exists: in a decode step every weight matrix is read from memory once and used for only a
// few rows, so the step is bound by memory traffic, not arithmetic. A general GEMM (MKL's sgemm)
// copies ("packs") the weight into its own layout on every call, which costs that traffic again;
// on a 2-core Xeon it took 1.4-1.9x the time of this kernel for 4-16 rows (`python -m engine bench-cpu`).
// This kernel reads each weight once, in the order it lies in memory:
//   - output column n of y is the dot product of a row of x with weight row n, and weight rows are
//     contiguous, so a tile of kCols = 4 weight rows is one contiguous stretch of 4 * K floats;
//     tiles are shared out among threads, so each thread streams its own contiguous part of the
//     weight from start to end (the hardware prefetchers follow that);
//   - for a tile, up to kMaxRows = 6 rows of x are multiplied at once: 6 x 4 = 24 vector accumulators
//     (of AVX-512's 32 registers), each holding 16 partial sums; per 16 terms of K, 4 weight vectors
//     and 6 x vectors are loaded for 24 fused multiply-adds. Batches of more than 6 rows are cut into
//     balanced groups (16 rows: 6 + 5 + 5), and the tile stays in L1 cache while each group reads it;
//   - while the groups work on one tile, the next tile is prefetched into L2, spread over the
//     groups' loop iterations, so that reading memory overlaps with the arithmetic instead of
//     alternating with it;
//   - each accumulator lane sums every 16th term of K; the 16 lanes are then added up in a tree.
//     Its rounding error is below MKL's sgemm's (tested against the float64 product).
// In bfloat16 (x and weight both bf16, on CPUs with AVX512-BF16) the same tiles take 32 terms per step
// with _mm512_dpbf16_ps, summed in fp32 and rounded to bf16 once at the end: half the bytes per weight.
// llama.cpp's CPU matrix-vector products use the same dot-product form; vLLM's CPU backend delegates
// its linear layers to oneDNN.
//
// Built on first use by engine/cpu_ops.py (torch.utils.cpp_extension, -O3 -march=native -fopenmp).
// Without AVX-512 the same code compiles to GCC vector types of 16 floats: correct, but each becomes
// two or four registers (AVX2, NEON), 24 accumulators no longer fit in 16 or 32 registers, and it
// runs 3-5x slower than MKL at 8-16 rows. small_batch_linear_simd() says which was built, and the
// engine multiplies with F.linear where it is "generic".

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cstring>
#include <string>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int kCols = 4;         // weight rows (output columns) per tile
constexpr int kMaxRows = 6;      // rows of x per register tile: 6 x 4 = 24 vector accumulators
constexpr int64_t kLanes = 16;   // floats per vector
constexpr int64_t kLine = 64;    // bytes per cache line

#if defined(__AVX512F__)
using vec = __m512;
inline vec vzero() { return _mm512_setzero_ps(); }
inline vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline vec vfma(vec a, vec b, vec acc) { return _mm512_fmadd_ps(a, b, acc); }
inline float vsum(vec v) { return _mm512_reduce_add_ps(v); }
#else
typedef float vec __attribute__((vector_size(64)));
inline vec vzero() { return vec{}; }
inline vec vload(const float* p) {
  vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline vec vfma(vec a, vec b, vec acc) { return acc + a * b; }
inline float vsum(vec v) {  // the same pairwise tree as the AVX-512 reduction
  float s[kLanes];
  std::memcpy(s, &v, sizeof s);
  for (int64_t width = kLanes / 2; width > 0; width /= 2)
    for (int64_t i = 0; i < width; ++i) s[i] += s[i + width];
  return s[0];
}
#endif

// What one vector step of the dot products is for an element type E:
//   float: 16 floats of x times 16 of w, fused multiply-adds into 16 fp32 lanes;
//   bfloat16 (AVX512-BF16 only): 32 bf16 of x times 32 of w, _mm512_dpbf16_ps: lane l adds the
//   products of elements 2l and 2l + 1, in fp32. Half the bytes of fp32 per weight: a decode step
//   that reads every weight once reads half as much.
template <typename E>
struct Step;
template <>
struct Step<float> {
  using in = vec;
  static constexpr int64_t size = kLanes;
  static in load(const float* p) { return vload(p); }
  static vec madd(in x, in w, vec acc) { return vfma(x, w, acc); }
};
#if defined(__AVX512BF16__) && defined(__AVX512F__)
template <>
struct Step<c10::BFloat16> {
  using in = __m512bh;
  static constexpr int64_t size = 2 * kLanes;
  static in load(const c10::BFloat16* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static vec madd(in x, in w, vec acc) { return _mm512_dpbf16_ps(acc, x, w); }
};
#endif

// y[m, j] = x[m, :] . w[j, :] for MR rows of x (ldx apart) and NC weight rows (K apart, contiguous);
// y rows ldy apart. Each iteration also prefetches `lines` cache lines at `ahead` into L2.
template <typename E, int MR, int NC>
void tile(const E* x, int64_t ldx, const E* w, int64_t K, E* y, int64_t ldy, const char*& ahead, int lines) {
  using S = Step<E>;
  vec acc[MR][NC];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NC; ++j) acc[m][j] = vzero();
  const int64_t k_vec = K - K % S::size;
  for (int64_t k = 0; k < k_vec; k += S::size) {
    for (int l = 0; l < lines; ++l) __builtin_prefetch(ahead + kLine * l, 0, 2);  // 2: into L2
    ahead += kLine * lines;
    typename S::in wv[NC];
    for (int j = 0; j < NC; ++j) wv[j] = S::load(w + j * K + k);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const typename S::in xv = S::load(x + m * ldx + k);
      for (int j = 0; j < NC; ++j) acc[m][j] = S::madd(xv, wv[j], acc[m][j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NC; ++j) {
      float s = vsum(acc[m][j]);
      for (int64_t k = k_vec; k < K; ++k) s += static_cast<float>(x[m * ldx + k]) * static_cast<float>(w[j * K + k]);  // the last terms
      y[m * ldy + j] = static_cast<E>(s);
    }
}

template <typename E, int NC>
void tile_rows(int64_t rows, const E* x, int64_t K, const E* w, E* y, int64_t N, const char*& ahead, int lines) {
  switch (rows) {
    case 6: tile<E, 6, NC>(x, K, w, K, y, N, ahead, lines); break;
    case 5: tile<E, 5, NC>(x, K, w, K, y, N, ahead, lines); break;
    case 4: tile<E, 4, NC>(x, K, w, K, y, N, ahead, lines); break;
    case 3: tile<E, 3, NC>(x, K, w, K, y, N, ahead, lines); break;
    case 2: tile<E, 2, NC>(x, K, w, K, y, N, ahead, lines); break;
    case 1: tile<E, 1, NC>(x, K, w, K, y, N, ahead, lines); break;
    default: break;
  }
}

// All M rows for weight rows n0 .. n0 + cols - 1 (cols <= kCols), in balanced groups of <= kMaxRows.
template <typename E>
void column_tile(const E* x, int64_t M, int64_t K, const E* weight, int64_t n0, int64_t cols, E* y, int64_t N) {
  const int64_t groups = (M + kMaxRows - 1) / kMaxRows;
  const int64_t base = M / groups, extra = M % groups;  // the first `extra` groups take one row more
  // The next tile (kCols rows of K elements; each vector step covers one line of each row) is
  // prefetched over the groups' iterations.
  const int lines = static_cast<int>((kCols + groups - 1) / groups);
  const char* ahead = reinterpret_cast<const char*>(weight + (n0 + kCols) * K);
  int64_t m = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t rows = base + (g < extra ? 1 : 0);
    const E* xm = x + m * K;
    E* ym = y + m * N + n0;
    if (cols == kCols) {
      tile_rows<E, kCols>(rows, xm, K, weight + n0 * K, ym, N, ahead, lines);
    } else {  // the last N % 4 columns, one at a time
      for (int64_t j = 0; j < cols; ++j) tile_rows<E, 1>(rows, xm, K, weight + (n0 + j) * K, ym + j, N, ahead, 0);
    }
    m += rows;
  }
}

template <typename E>
void multiply(const at::Tensor& xc, const at::Tensor& weight, at::Tensor& y) {
  const int64_t M = xc.size(0), K = xc.size(1), N = weight.size(0);
  const E* xp = xc.data_ptr<E>();
  const E* wp = weight.data_ptr<E>();
  E* yp = y.data_ptr<E>();
  const int64_t tiles = (N + kCols - 1) / kCols;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n0 = t * kCols;
      column_tile<E>(xp, M, K, wp, n0, N - n0 < kCols ? N - n0 : kCols, yp, N);
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

at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 2, "small_batch_linear: x [M, K] and weight [N, K] must be 2-D");
  const bool bf16 = x.scalar_type() == at::kBFloat16 && weight.scalar_type() == at::kBFloat16;
  TORCH_CHECK((x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat) || (bf16 && small_batch_linear_bf16()),
              small_batch_linear_bf16() ? "small_batch_linear: float32 or bfloat16 only (x and weight alike)"
                                        : "small_batch_linear: float32 only (bfloat16 needs a CPU with AVX512-BF16)");
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "small_batch_linear: CPU tensors only");
  TORCH_CHECK(x.size(1) == weight.size(1), "small_batch_linear: x is [M, ", x.size(1), "] but weight is [N, ", weight.size(1), "]");
  TORCH_CHECK(weight.is_contiguous(), "small_batch_linear: weight must be contiguous");
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = weight.size(0);
  at::Tensor y = at::empty({M, N}, xc.options());
  if (M == 0 || N == 0) return y;
  if (K == 0) return y.zero_();
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  if (bf16) {
    multiply<c10::BFloat16>(xc, weight, y);
    return y;
  }
#endif
  multiply<float>(xc, weight, y);
  return y;
}

std::string small_batch_linear_simd() {
#if defined(__AVX512F__)
  return "avx512";
#else
  return "generic";
#endif
}

}  // namespace

TORCH_LIBRARY(pagedattention_lab, m) {
  m.def("small_batch_linear(Tensor x, Tensor weight) -> Tensor");
  m.def("small_batch_linear_simd() -> str", &small_batch_linear_simd);  // no tensors: no dispatch key needed
  m.def("small_batch_linear_bf16() -> bool", &small_batch_linear_bf16);
}

TORCH_LIBRARY_IMPL(pagedattention_lab, CPU, m) { m.impl("small_batch_linear", &small_batch_linear); }
