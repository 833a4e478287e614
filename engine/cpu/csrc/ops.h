// The entry points of the engine's CPU kernels, for C++ callers (decode_layer.cpp) that skip the
// dispatcher. Each is also registered as torch.ops.pagedattention_lab.<name>; see engine/cpu_ops.py
// for what each takes and returns.
#pragma once

#include <ATen/core/Tensor.h>  // not ATen/ATen.h, which declares every operator: a third of a build's time

#include <string>
#include <tuple>
#include <vector>

namespace pagedattention_lab {

// small_batch_linear.cpp: x [M, K] times an [N, K] weight packed by pack_weight_ -> [M, N].
at::Tensor small_batch_linear(const at::Tensor& x, const at::Tensor& packed, int64_t N);
// The same for several weights of the same K (q, k and v; gate and up) in one parallel region -> one [M, N_i] each.
std::vector<at::Tensor> small_batch_linears(const at::Tensor& x, at::TensorList packed, at::IntArrayRef ns);
void pack_weight_(const at::Tensor& weight, at::Tensor packed);
std::string small_batch_linear_simd();

// fused_ops.cpp: (weight * rms_normalize(x + residual), x + residual); RoPE on q and k.
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& residual, const at::Tensor& weight, double eps);
void add_rms_norm_(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);
std::tuple<at::Tensor, at::Tensor> rotary_embedding(const at::Tensor& q, const at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin);

// activation.cpp: silu(gate) * up.
at::Tensor silu_and_mul(const at::Tensor& gate, const at::Tensor& up);
at::Tensor& silu_and_mul_(at::Tensor& gate, const at::Tensor& up);

// paged_attention.cpp: decode attention through the block tables -> [num_seqs, num_heads, head_dim];
// sliding_window 0: full attention, W: the last W positions only; fp8 caches read as fp8 * k_scale and fp8 * v_scale.
at::Tensor paged_attention_decode(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                                  const at::Tensor& block_tables, const at::Tensor& context_lens, double scale, int64_t sliding_window = 0,
                                  double k_scale = 1.0, double v_scale = 1.0);

}  // namespace pagedattention_lab
