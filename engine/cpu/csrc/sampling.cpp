// Greedy sampling on CPU: the index of each row's maximum, in one call.
//
//   greedy_tokens(logits) -> tokens
//       logits [num_seqs, vocab_size] float32 (rows may be strided; each row contiguous)
//       tokens [num_seqs] int64: the first index of the row's maximum, NaN counting as the largest
//       (torch.argmax's answer, ties and NaN included)
//
// Why: engine/sampler.py's greedy_tokens does the same with six torch operators (amax per chunk of
// 1,024 logits, then argmax inside the winning chunk), because argmax itself does not vectorise its
// search. Right after a decode step has streamed the weights through the caches, each of those
// operators runs with cold caches (~0.16 ms for the first one here, against ~5 us warm), so the six
// took 0.34-0.49 ms per step at 1-16 rows. Here it is one call: per row, the maximum a vector at a time
// (csrc/simd.h; and whether there is any NaN), then the first position that holds it.
//
// Built with the other CPU kernels by engine/cpu_ops.py.

#include <ATen/core/Tensor.h>  // not ATen/ATen.h, which declares every operator: a third of a build's time
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "ops.h"

#include <cmath>
#include <limits>

#include "simd.h"

namespace {

// The first index of the maximum of x[0:n] (n >= 1), NaN counting as the largest.
int64_t first_argmax(const float* x, int64_t n) {
  constexpr int W = simd::kWidth;
  float best = -std::numeric_limits<float>::infinity();
  bool any_nan = false;
  int64_t i = 0;
  simd::vfloat vmax = simd::set1(best);
  uint32_t nan = 0;
  for (; i + W <= n; i += W) {
    const simd::vfloat v = simd::load(x + i);
    nan |= simd::nan_lanes(v);
    vmax = simd::vmax(vmax, v);  // a NaN lane may be dropped here: `nan` has seen it
  }
  best = simd::reduce_max(vmax);
  any_nan = nan != 0;
  for (; i < n; ++i) {
    if (std::isnan(x[i])) any_nan = true;
    else if (x[i] > best) best = x[i];
  }
  i = 0;
  const simd::vfloat target = simd::set1(best);
  for (; i + W <= n; i += W) {
    const simd::vfloat v = simd::load(x + i);
    const uint32_t hit = any_nan ? simd::nan_lanes(v) : simd::equal_lanes(v, target);
    if (hit) return i + __builtin_ctz(hit);
  }
  for (; i < n; ++i)
    if (any_nan ? std::isnan(x[i]) : x[i] == best) return i;
  return 0;  // not reached: the maximum is in the row
}

}  // namespace

namespace pagedattention_lab {

at::Tensor greedy_tokens(const at::Tensor& logits) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0, "greedy_tokens: logits must be [num_seqs, vocab_size] with vocab_size >= 1, got ",
              logits.sizes());
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.device().is_cpu(), "greedy_tokens: float32 CPU logits only, got ",
              logits.scalar_type(), " on ", logits.device());
  const at::Tensor x = logits.stride(1) == 1 ? logits : logits.contiguous();
  const int64_t rows = x.size(0), vocab = x.size(1), stride = x.stride(0);
  at::Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  at::parallel_for(0, rows, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) op[r] = first_argmax(xp + r * stride, vocab);
  });
  return out;
}

}  // namespace pagedattention_lab

TORCH_LIBRARY_FRAGMENT(pagedattention_lab, m) { m.def("greedy_tokens(Tensor logits) -> Tensor"); }

TORCH_LIBRARY_IMPL(pagedattention_lab, CPU, m) { m.impl("greedy_tokens", &pagedattention_lab::greedy_tokens); }
