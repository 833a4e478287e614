// Two of the small operations of every decoder layer, each fused into one call on CPU (fp32):
//
//   add_rms_norm(x, residual, weight, eps) -> (normed, new_residual)
//       new_residual = x + residual;  normed = weight * (new_residual * rsqrt(mean(new_residual^2) + eps))
//       vLLM's fused_add_rms_norm: the residual connection of one sub-layer and the RMSNorm in front of
//       the next are one pass over the hidden states instead of seven operator calls.
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

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>

// a * b + c must stay two roundings (as in torch), never one fused multiply-add.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace {

constexpr int64_t kLanes = 16;

// Sum of squares of n floats in 16 interleaved partial sums, then a pairwise tree.
float sum_of_squares(const float* __restrict__ v, int64_t n) {
  float part[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) part[l] += v[i + l] * v[i + l];
  for (int64_t l = 0; i < n; ++i, ++l) part[l] += v[i] * v[i];
  for (int64_t width = kLanes / 2; width > 0; width /= 2)
    for (int64_t l = 0; l < width; ++l) part[l] += part[l + width];
  return part[0];
}

std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && residual.sizes() == x.sizes(), "add_rms_norm: x and residual must both be [num_tokens, hidden], got ",
              x.sizes(), " and ", residual.sizes());
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1), "add_rms_norm: weight must be [hidden] = [", x.size(1), "], got ", weight.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && residual.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "add_rms_norm: float32 only");
  TORCH_CHECK(x.device().is_cpu() && residual.device().is_cpu() && weight.device().is_cpu(), "add_rms_norm: CPU tensors only");
  const at::Tensor xc = x.contiguous(), rc = residual.contiguous(), wc = weight.contiguous();
  const int64_t rows = xc.size(0), hidden = xc.size(1);
  at::Tensor sum = at::empty_like(xc), normed = at::empty_like(xc);
  const float *xp = xc.data_ptr<float>(), *rp = rc.data_ptr<float>(), *wp = wc.data_ptr<float>();
  float *sp = sum.data_ptr<float>(), *np = normed.data_ptr<float>();
  const float epsf = static_cast<float>(eps);
  at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {  // decode-sized batches stay on one thread
    for (int64_t r = r0; r < r1; ++r) {
      const float* __restrict__ a = xp + r * hidden;
      const float* __restrict__ b = rp + r * hidden;
      float* __restrict__ s = sp + r * hidden;
      float* __restrict__ out = np + r * hidden;
      for (int64_t i = 0; i < hidden; ++i) s[i] = a[i] + b[i];
      const float inv = 1.0f / std::sqrt(sum_of_squares(s, hidden) / static_cast<float>(hidden) + epsf);
      for (int64_t i = 0; i < hidden; ++i) out[i] = wp[i] * (s[i] * inv);
    }
  });
  return {normed, sum};
}

// out[h, :] = x[h, :] * cos + rotate_half(x[h, :]) * sin for the heads of one token.
void rotate_heads(const float* __restrict__ x, int64_t heads, int64_t dim, const float* __restrict__ cos, const float* __restrict__ sin,
                  float* __restrict__ out) {
  const int64_t half = dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const float* __restrict__ xh = x + h * dim;
    float* __restrict__ oh = out + h * dim;
    for (int64_t i = 0; i < half; ++i) {
      const float a = xh[i] * cos[i], b = (-xh[i + half]) * sin[i];
      oh[i] = a + b;
    }
    for (int64_t i = half; i < dim; ++i) {
      const float a = xh[i] * cos[i], b = xh[i - half] * sin[i];
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
  for (const at::Tensor* t : {&q, &k, &cos, &sin}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat, "rotary_embedding: float32 only");
    TORCH_CHECK(t->device().is_cpu(), "rotary_embedding: CPU tensors only");
  }
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), cc = cos.contiguous(), sc = sin.contiguous();
  at::Tensor q_out = at::empty_like(qc), k_out = at::empty_like(kc);
  const int64_t hq = qc.size(1), hk = kc.size(1);
  const float *qp = qc.data_ptr<float>(), *kp = kc.data_ptr<float>(), *cp = cc.data_ptr<float>(), *sp = sc.data_ptr<float>();
  float *qo = q_out.data_ptr<float>(), *ko = k_out.data_ptr<float>();
  at::parallel_for(0, n, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      rotate_heads(qp + t * hq * dim, hq, dim, cp + t * dim, sp + t * dim, qo + t * hq * dim);
      rotate_heads(kp + t * hk * dim, hk, dim, cp + t * dim, sp + t * dim, ko + t * hk * dim);
    }
  });
  return {q_out, k_out};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pagedattention_lab, m) {
  m.def("add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rotary_embedding(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(pagedattention_lab, CPU, m) {
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("rotary_embedding", &rotary_embedding);
}
