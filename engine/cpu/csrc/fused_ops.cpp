// Two of the small operations of every decoder layer, each fused into one call on CPU (fp32 or bf16):
//
//   add_rms_norm(x, residual, weight, eps) -> (normed, new_residual)
//       new_residual = x + residual;  normed = weight * (new_residual * rsqrt(mean(new_residual^2) + eps))
//       vLLM's fused_add_rms_norm: the residual connection of one sub-layer and the RMSNorm in front of
//       the next are one pass over the hidden states instead of seven operator calls.
//   add_rms_norm_(x, residual, weight, eps): the same in place (residual <- new_residual, x <- normed)
//   rotary_embedding(q, k, cos, sin) -> (q_rotated, k_rotated)
//       out = x * cos + rotate_half(x) * sin for every head of q and k (GPT-NeoX / Llama layout:
//       element i pairs with element i + head_dim / 2), vLLM's rotary_embedding: one call for q and k
//       instead of seven operator calls each.
//
// Why: in a decode step each of these works on a few rows of 576 floats, so the time goes into
// calling operators (a few microseconds each), not into arithmetic. A decode step of SmolLM2-135M
// makes 1,286 operator calls from Python with them instead of 1,916 (3,555 instead of 5,625 counting
// the calls torch makes inside its own operators; torch profiler). The results are those of the torch code in engine/model.py: rotary
// exactly (the same products and sums, never fused into one multiply-add), RMSNorm within float
// rounding (the mean of squares is summed in another order).
//
// Built with the matmul kernel by engine/cpu_ops.py. Inference only: no autograd (the Python wrappers refuse inputs that need it).

#include <ATen/core/Tensor.h>  // not ATen/ATen.h, which declares every operator: a third of a build's time
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "ops.h"

#include <cmath>
#include <initializer_list>
#include <tuple>
#include <type_traits>
#include <vector>

// a * b + c must stay two roundings (as in torch), never one fused multiply-add.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace {

constexpr int64_t kSumLanes = 16;

// Sum of squares of n floats in 16 interleaved partial sums, then a pairwise tree.
float sum_of_squares(const float* __restrict__ v, int64_t n) {
  float part[kSumLanes] = {};
  int64_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes)
    for (int64_t l = 0; l < kSumLanes; ++l) part[l] += v[i + l] * v[i + l];
  for (int64_t l = 0; i < n; ++i, ++l) part[l] += v[i] * v[i];
  for (int64_t width = kSumLanes / 2; width > 0; width /= 2)
    for (int64_t l = 0; l < width; ++l) part[l] += part[l + width];
  return part[0];
}

// One row of add_rms_norm. In bf16, each step rounds where the torch code of engine/model.py rounds
// (the sum to bf16, the normalised value to bf16, then weight x it to bf16); the mean of squares is in fp32.
// s may be b and out may be a (add_rms_norm_, in place): each element is read before its own index is written.
template <typename T>
void add_rms_norm_row(const T* a, const T* b, const T* w, int64_t hidden, float eps, T* s, T* out, float* buffer) {
  for (int64_t i = 0; i < hidden; ++i) s[i] = static_cast<T>(static_cast<float>(a[i]) + static_cast<float>(b[i]));
  const float* sf = reinterpret_cast<const float*>(s);
  if constexpr (!std::is_same_v<T, float>) {
    for (int64_t i = 0; i < hidden; ++i) buffer[i] = static_cast<float>(s[i]);
    sf = buffer;
  }
  const float inv = 1.0f / std::sqrt(sum_of_squares(sf, hidden) / static_cast<float>(hidden) + eps);
  for (int64_t i = 0; i < hidden; ++i)
    out[i] = static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(static_cast<T>(sf[i] * inv)));
}

void check_dtypes(const char* op, std::initializer_list<const at::Tensor*> tensors) {
  const at::ScalarType dtype = (*tensors.begin())->scalar_type();
  for (const at::Tensor* t : tensors) {
    TORCH_CHECK(t->scalar_type() == dtype && (dtype == at::kFloat || dtype == at::kBFloat16), op,
                ": float32 or bfloat16 only, all inputs alike, got ", t->scalar_type(), " and ", dtype);
    TORCH_CHECK(t->device().is_cpu(), op, ": CPU tensors only");
  }
}

}  // namespace

// The entry points, declared in ops.h (decode_layer.cpp calls them without the dispatcher).
namespace pagedattention_lab {

namespace {

// sum = x + residual, normed = weight * rms_normalize(sum), row by row; the outputs may be x and residual themselves.
void add_rms_norm_into(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps, at::Tensor& sum,
                       at::Tensor& normed) {
  const int64_t rows = x.size(0), hidden = x.size(1);
  const float epsf = static_cast<float>(eps);
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T *xp = x.data_ptr<T>(), *rp = residual.data_ptr<T>(), *wp = weight.data_ptr<T>();
    T *sp = sum.data_ptr<T>(), *np = normed.data_ptr<T>();
    at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {  // decode-sized batches stay on one thread
      std::vector<float> buffer(std::is_same_v<T, float> ? 0 : hidden);
      for (int64_t r = r0; r < r1; ++r)
        add_rms_norm_row<T>(xp + r * hidden, rp + r * hidden, wp, hidden, epsf, sp + r * hidden, np + r * hidden, buffer.data());
    });
  };
  if (x.scalar_type() == at::kFloat)
    run(static_cast<float*>(nullptr));
  else
    run(static_cast<c10::BFloat16*>(nullptr));
}

void check_add_rms_norm(const char* op, const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && residual.sizes() == x.sizes(), op, ": x and residual must both be [num_tokens, hidden], got ", x.sizes(), " and ",
              residual.sizes());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1), op, ": weight must be [hidden] = [", x.size(1), "], got ", weight.sizes());
  check_dtypes(op, {&x, &residual, &weight});
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps) {
  check_add_rms_norm("add_rms_norm", x, residual, weight);
  const at::Tensor xc = x.contiguous(), rc = residual.contiguous(), wc = weight.contiguous();
  at::Tensor sum = at::empty_like(xc), normed = at::empty_like(xc);
  add_rms_norm_into(xc, rc, wc, eps, sum, normed);
  return {normed, sum};
}

// In place, as vLLM's fused_add_rms_norm: residual becomes x + residual and x its normalised form. A prefill's
// hidden states are megabytes that have left the caches: writing into the two tensors just read spares the
// memory traffic of two fresh outputs.
void add_rms_norm_(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps) {
  check_add_rms_norm("add_rms_norm_", x, residual, weight);
  TORCH_CHECK(x.is_contiguous() && residual.is_contiguous(), "add_rms_norm_: x and residual must be contiguous (they are written in place)");
  TORCH_CHECK(x.data_ptr() != residual.data_ptr(), "add_rms_norm_: x and residual must be two tensors");
  add_rms_norm_into(x, residual, weight.contiguous(), eps, residual, x);
}

// out[h, :] = x[h, :] * cos + rotate_half(x[h, :]) * sin for the heads of one token. In bf16 every
// product and the sum are rounded to bf16, as torch's bf16 operators in engine/model.py round them.
template <typename T>
void rotate_heads(const T* __restrict__ x, int64_t heads, int64_t dim, const T* __restrict__ cos, const T* __restrict__ sin,
                  T* __restrict__ out) {
  const int64_t half = dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const T* __restrict__ xh = x + h * dim;
    T* __restrict__ oh = out + h * dim;
    for (int64_t i = 0; i < half; ++i) {
      const T a = xh[i] * cos[i], b = (-xh[i + half]) * sin[i];
      oh[i] = a + b;
    }
    for (int64_t i = half; i < dim; ++i) {
      const T a = xh[i] * cos[i], b = xh[i - half] * sin[i];
      oh[i] = a + b;
    }
  }
}

std::tuple<at::Tensor, at::Tensor> rotary_embedding(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3, "rotary_embedding: q and k must be [num_tokens, heads, head_dim]");
  const int64_t n = q.size(0), dim = q.size(2);
  TORCH_CHECK(k.size(0) == n && k.size(2) == dim, "rotary_embedding: q is ", q.sizes(), " but k is ", k.sizes());
  TORCH_CHECK(dim % 2 == 0, "rotary_embedding: head_dim must be even, got ", dim);
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(t->dim() >= 2 && t->size(0) == n && t->size(-1) == dim && t->numel() == n * dim,
                "rotary_embedding: cos and sin must be [num_tokens, head_dim] or [num_tokens, 1, head_dim] with num_tokens = ", n,
                " and head_dim = ", dim, ", got ", cos.sizes(), " and ", sin.sizes());
  check_dtypes("rotary_embedding", {&q, &k, &cos, &sin});
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), cc = cos.contiguous(), sc = sin.contiguous();
  at::Tensor q_out = at::empty_like(qc), k_out = at::empty_like(kc);
  const int64_t hq = qc.size(1), hk = kc.size(1);
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T *qp = qc.data_ptr<T>(), *kp = kc.data_ptr<T>(), *cp = cc.data_ptr<T>(), *sp = sc.data_ptr<T>();
    T *qo = q_out.data_ptr<T>(), *ko = k_out.data_ptr<T>();
    at::parallel_for(0, n, 64, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        rotate_heads<T>(qp + t * hq * dim, hq, dim, cp + t * dim, sp + t * dim, qo + t * hq * dim);
        rotate_heads<T>(kp + t * hk * dim, hk, dim, cp + t * dim, sp + t * dim, ko + t * hk * dim);
      }
    });
  };
  if (qc.scalar_type() == at::kFloat)
    run(static_cast<float*>(nullptr));
  else
    run(static_cast<c10::BFloat16*>(nullptr));
  return {q_out, k_out};
}

}  // namespace pagedattention_lab

TORCH_LIBRARY_FRAGMENT(pagedattention_lab, m) {
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("add_rms_norm_(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()");
  m.def("rotary_embedding(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pagedattention_lab, CPU, m) {
  m.impl("add_rms_norm", &pagedattention_lab::add_rms_norm);
  m.impl("add_rms_norm_", &pagedattention_lab::add_rms_norm_);
  m.impl("rotary_embedding", &pagedattention_lab::rotary_embedding);
}
