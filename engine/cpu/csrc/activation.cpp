// SwiGLU's activation in one pass on CPU (vLLM's silu_and_mul, csrc/activation_kernels.cu, which
// takes gate and up concatenated; here they are the two projections' separate outputs):
//
//   silu_and_mul(gate, up) -> out
//       gate, up  [num_tokens, intermediate_size]  fp32 or bf16, the same shape and dtype
//       out       [num_tokens, intermediate_size]  gate's dtype;  out = silu(gate) * up
//       silu(g) = g * sigmoid(g) = g / (1 + exp(-g)), computed in fp32 whatever the dtype.
//   silu_and_mul_(gate, up) -> gate: the same written over gate (a prefill's MLP, whose gate is not read again).
//
// Why: torch computes F.silu(gate) * up as two operators, each a pass over memory with its own
// output tensor, and a call from Python each; a decode step of SmolLM2-135M makes 30 of each. Here
// it is one pass and one call: 16 x 1536 (a 16-request decode step's MLP) took 6.0 us against torch's
// 15.2 us, 1 x 1536 2.4 against 3.3 us (2-core EPYC, throwaway harness alternating the two).
//
// exp: csrc/vec_exp.h (a vector at a time: 16 values with AVX-512, 8 with AVX2).
//
// Built with the other CPU kernels by engine/cpu_ops.py. Inference only: no autograd.

#include <ATen/core/Tensor.h>  // not ATen/ATen.h, which declares every operator: a third of a build's time
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "ops.h"

#include <cstdint>

#include "vec_exp.h"

namespace {

constexpr int64_t kGrain = 16384;  // elements per thread at least: a decode step's 16 x 1536 is one or two tasks

inline float silu_mul_one(float g, float u) { return g / (1.0f + vec_exp::exp1(-g)) * u; }

// out may be gate (silu_and_mul_, in place): each element is read before its own index is written.
template <typename T>
void silu_mul(const T* gate, const T* __restrict__ up, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(silu_mul_one(static_cast<float>(gate[i]), static_cast<float>(up[i])));
}

#if defined(PAGEDATTENTION_LAB_SIMD)
// The same arithmetic, a vector at a time (csrc/simd.h; the compiler does not vectorize the loop above).
template <>
void silu_mul<float>(const float* gate, const float* __restrict__ up, float* out, int64_t n) {
  const simd::vfloat one = simd::set1(1.0f);
  int64_t i = 0;
  for (; i + simd::kWidth <= n; i += simd::kWidth) {
    const simd::vfloat g = simd::load(gate + i);
    simd::store(out + i, g / (one + vec_exp::expv(-g)) * simd::load(up + i));
  }
  for (; i < n; ++i) out[i] = silu_mul_one(gate[i], up[i]);
}
#endif

#if defined(__AVX512BF16__) && defined(__AVX512F__)
// bf16 (CPUs with AVX512-BF16, which bf16 matmuls need anyway): 16 values widened to fp32 (a bf16 is
// the top half of a float), the same arithmetic, then rounded to the nearest bf16, ties to even (what
// c10::BFloat16 does; NaN stays NaN). Elsewhere bf16 takes the loop above.
inline __m512 widen(const c10::BFloat16* p) { return simd::load(p); }
inline __m256i narrow(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }
template <>
void silu_mul<c10::BFloat16>(const c10::BFloat16* gate, const c10::BFloat16* __restrict__ up, c10::BFloat16* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = widen(gate + i);
    const __m512 denominator = _mm512_add_ps(one, vec_exp::expv(_mm512_sub_ps(_mm512_setzero_ps(), g)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), narrow(_mm512_mul_ps(_mm512_div_ps(g, denominator), widen(up + i))));
  }
  for (; i < n; ++i) out[i] = static_cast<c10::BFloat16>(silu_mul_one(static_cast<float>(gate[i]), static_cast<float>(up[i])));
}
#endif  // __AVX512BF16__

}  // namespace

// The entry points, declared in ops.h (decode_layer.cpp calls them without the dispatcher).
namespace pagedattention_lab {

namespace {

void check_silu_and_mul(const char* op, const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes(), op, ": gate and up must have one shape, got ", gate.sizes(), " and ", up.sizes());
  TORCH_CHECK(gate.scalar_type() == up.scalar_type() && (gate.scalar_type() == at::kFloat || gate.scalar_type() == at::kBFloat16), op,
              ": float32 or bfloat16 only (gate and up alike), got ", gate.scalar_type(), " and ", up.scalar_type());
  TORCH_CHECK(gate.device().is_cpu() && up.device().is_cpu(), op, ": CPU tensors only");
}

// out = silu(g) * u element by element (g, u contiguous; out may be g).
void silu_and_mul_into(const at::Tensor& g, const at::Tensor& u, at::Tensor& out) {
  const int64_t n = g.numel();
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T *gp = g.data_ptr<T>(), *upp = u.data_ptr<T>();
    T* op = out.data_ptr<T>();
    at::parallel_for(0, n, kGrain, [&](int64_t i0, int64_t i1) { silu_mul<T>(gp + i0, upp + i0, op + i0, i1 - i0); });
  };
  if (g.scalar_type() == at::kFloat)
    run(static_cast<float*>(nullptr));
  else
    run(static_cast<c10::BFloat16*>(nullptr));
}

}  // namespace

at::Tensor silu_and_mul(const at::Tensor& gate, const at::Tensor& up) {
  check_silu_and_mul("silu_and_mul", gate, up);
  const at::Tensor g = gate.contiguous(), u = up.contiguous();
  at::Tensor out = at::empty_like(g);
  silu_and_mul_into(g, u, out);
  return out;
}

// In place into gate: a prefill's gate is megabytes that have left the caches, and writing the result
// over it spares the memory traffic of a fresh output.
at::Tensor& silu_and_mul_(at::Tensor& gate, const at::Tensor& up) {
  check_silu_and_mul("silu_and_mul_", gate, up);
  TORCH_CHECK(gate.is_contiguous(), "silu_and_mul_: gate must be contiguous (it is written in place)");
  TORCH_CHECK(gate.data_ptr() != up.data_ptr() || gate.numel() == 0, "silu_and_mul_: gate and up must be two tensors");
  silu_and_mul_into(gate, up.contiguous(), gate);
  return gate;
}

}  // namespace pagedattention_lab

TORCH_LIBRARY_FRAGMENT(pagedattention_lab, m) {
  m.def("silu_and_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("silu_and_mul_(Tensor(a!) gate, Tensor up) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(pagedattention_lab, CPU, m) {
  m.impl("silu_and_mul", &pagedattention_lab::silu_and_mul);
  m.impl("silu_and_mul_", &pagedattention_lab::silu_and_mul_);
}
