// y = x @ weight_kn for decode-sized batches on CPU: x [M, K] fp32 with M small (1-32 rows, one per
// running request), weight_kn [K, N] fp32 row-major (the transpose of nn.Linear's [N, K] weight).
//
// Why it exists: in a decode step every weight matrix is read from memory once and used for only a
// few rows, so the step is bound by memory traffic, not arithmetic. A general GEMM (MKL's sgemm)
// copies ("packs") the weight into its own layout on every call, which costs that traffic again;
// on a 2-core Xeon it took ~2x the time of a plain read of the weights for 8-16 rows. This kernel
// reads each weight once, straight from its [K, N] layout:
//   - the N columns are cut into 64-wide tiles (4 vectors of 16 floats), shared out among threads;
//   - for a tile, up to 6 rows of x are kept in 24 vector accumulators (a 6 x 64 register tile: 24 of
//     AVX-512's 32 registers; without AVX-512 the compiler splits each vector in two and some spill), and
//     each weight row k of the tile (256 bytes) is loaded once and multiplied into all 6 rows;
//   - rows of the tile lie N * 4 bytes apart, so the next rows are prefetched by hand (the hardware
//     prefetcher does not follow a stride that crosses a page every row);
//   - sums are kept per block of kBlockK terms and then added up, which keeps the rounding error close
//     to a blocked GEMM's (one running sum over all K drifts further from the exact result).
// llama.cpp's and vLLM's CPU backends use the same kind of register-tiled microkernel.
//
// Built on first use by engine/cpu_linear.py (torch.utils.cpp_extension, -O3 -march=native -fopenmp).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kTile = 64;      // columns per tile: 4 vectors of 16 floats
constexpr int kMaxRows = 6;        // rows per register tile: 6 x 4 = 24 vector accumulators
constexpr int64_t kBlockK = 128;   // terms summed in registers before they are added to the output
constexpr int64_t kPrefetch = 32;  // weight rows read ahead

typedef float v16 __attribute__((vector_size(64)));

inline v16 load16(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store16(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }

inline v16 broadcast(const float* p) {
#if defined(__AVX512F__)
  return (v16)_mm512_set1_ps(*p);  // a load-port broadcast, leaving the FMA ports free
#else
  return v16{} + *p;
#endif
}

// y[0:MR, 0:64] = x[0:MR, :] @ w[:, 0:64]; x rows ldx apart, w rows ldw apart, y rows ldy apart.
template <int MR>
void tile(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t K) {
  v16 sum[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 4; ++j) sum[m][j] = v16{};
  for (int64_t k0 = 0; k0 < K; k0 += kBlockK) {
    const int64_t k1 = k0 + kBlockK < K ? k0 + kBlockK : K;
    v16 acc[MR][4];
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < 4; ++j) acc[m][j] = v16{};
    for (int64_t k = k0; k < k1; ++k) {
      const float* wk = w + k * ldw;
      const float* ahead = wk + kPrefetch * ldw;  // past the end near k = K: a prefetch never faults
      __builtin_prefetch(ahead);
      __builtin_prefetch(ahead + 16);
      __builtin_prefetch(ahead + 32);
      __builtin_prefetch(ahead + 48);
      const v16 w0 = load16(wk), w1 = load16(wk + 16), w2 = load16(wk + 32), w3 = load16(wk + 48);
#pragma GCC unroll 8
      for (int m = 0; m < MR; ++m) {
        const v16 b = broadcast(x + m * ldx + k);
        acc[m][0] += b * w0;
        acc[m][1] += b * w1;
        acc[m][2] += b * w2;
        acc[m][3] += b * w3;
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < 4; ++j) sum[m][j] += acc[m][j];
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < 4; ++j) store16(y + m * ldy + 16 * j, sum[m][j]);
}

// All M rows for one 64-column tile, kMaxRows at a time (the weight tile stays in L2 between passes).
void column_tile(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y) {
  int64_t m = 0;
  for (; M - m >= kMaxRows; m += kMaxRows) tile<kMaxRows>(x + m * K, K, w, N, y + m * N, N, K);
  const float* xm = x + m * K;
  float* ym = y + m * N;
  switch (M - m) {
    case 5: tile<5>(xm, K, w, N, ym, N, K); break;
    case 4: tile<4>(xm, K, w, N, ym, N, K); break;
    case 3: tile<3>(xm, K, w, N, ym, N, K); break;
    case 2: tile<2>(xm, K, w, N, ym, N, K); break;
    case 1: tile<1>(xm, K, w, N, ym, N, K); break;
    default: break;
  }
}

at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& weight_kn) {
  TORCH_CHECK(x.dim() == 2 && weight_kn.dim() == 2, "small_batch_linear: x [M, K] and weight_kn [K, N] must be 2-D");
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight_kn.scalar_type() == at::kFloat, "small_batch_linear: float32 only");
  TORCH_CHECK(x.device().is_cpu() && weight_kn.device().is_cpu(), "small_batch_linear: CPU tensors only");
  TORCH_CHECK(x.size(1) == weight_kn.size(0), "small_batch_linear: x is [M, ", x.size(1), "] but weight_kn is [", weight_kn.size(0), ", N]");
  TORCH_CHECK(weight_kn.size(1) % kTile == 0, "small_batch_linear: N must be a multiple of ", kTile, ", got ", weight_kn.size(1));
  TORCH_CHECK(weight_kn.is_contiguous(), "small_batch_linear: weight_kn must be contiguous");
  const at::Tensor xc = x.contiguous();
  const int64_t M = xc.size(0), K = xc.size(1), N = weight_kn.size(1);
  at::Tensor y = at::empty({M, N}, xc.options());
  if (M == 0 || N == 0) return y;
  if (K == 0) return y.zero_();
  const float* xp = xc.data_ptr<float>();
  const float* wp = weight_kn.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, N / kTile, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) column_tile(xp, M, K, wp + t * kTile, N, yp + t * kTile);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(pagedattention_lab, m) { m.def("small_batch_linear(Tensor x, Tensor weight_kn) -> Tensor"); }

TORCH_LIBRARY_IMPL(pagedattention_lab, CPU, m) { m.impl("small_batch_linear", &small_batch_linear); }
