// One decoder layer of a decode step in one call, on CPU (fp32 or bf16):
//
//   decode_layer(hidden, residual, cos, sin, key_cache, value_cache, slot_mapping, block_tables, context_lens,
//                weights, biases, sizes, scale, eps) -> (hidden, residual)
//
// It does what DecoderLayer.forward in engine/model.py does when every token of the step is a decode
// token, with the same kernels in the same order, so its results are the module path's bit for bit:
//
//   x, residual = add_rms_norm(hidden, residual, input_layernorm)   (the first layer: residual = hidden, x = RMSNorm(hidden))
//   q, k, v     = small_batch_linears(x, q/k/v_proj) (+ bias)       (one parallel region; Qwen3: RMSNorm over head_dim on q and k)
//   q, k        = rotary_embedding(q, k, cos, sin)
//   key_cache[slot_mapping], value_cache[slot_mapping] = k, v       (vLLM's reshape_and_cache; slot -1 is not written)
//   attn        = paged_attention_decode(q, key_cache, value_cache, block_tables, context_lens, scale)
//   x, residual = add_rms_norm(o_proj(attn), residual, post_attention_layernorm)
//   hidden      = down_proj(silu_and_mul(gate_proj(x), up_proj(x)))  (gate and up in one parallel region)
//
// Why: the work of a decode step is the same either way, but from Python each of a layer's ~15
// operators costs a module call, argument checks and a trip through torch's dispatcher (a few
// microseconds each), paid 30 times per step for SmolLM2-135M. Here the layer is one operator call,
// and the kernels call each other directly (ops.h). It is the CPU counterpart of what CUDA graphs do
// for vLLM's decode steps on a GPU: launch a step's fixed sequence of kernels at once instead of one by one.
//
// weights: [input_layernorm, q_proj, k_proj, v_proj, o_proj, post_attention_layernorm, gate_proj, up_proj,
//           down_proj] (the projections as packed by pack_weight_, the norms as [hidden] vectors), then
//           [q_norm, k_norm] for Qwen3 (11 in all).
// biases:   the 7 projections' biases in that order (None where a projection has none).
// sizes:    [num_heads, num_kv_heads, head_dim, intermediate_size].
//
// Built with the other kernels by engine/cpu_ops.py. Inference only: no autograd.

#include <ATen/core/Tensor.h>  // not ATen/ATen.h, which declares every operator: a third of a build's time
#include <ATen/TensorOperators.h>
#include <ATen/ops/rms_norm.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "ops.h"

#include <cstring>
#include <optional>
#include <initializer_list>
#include <tuple>
#include <vector>

namespace {

using pagedattention_lab::add_rms_norm;
using pagedattention_lab::paged_attention_decode;
using pagedattention_lab::rotary_embedding;
using pagedattention_lab::silu_and_mul;
using pagedattention_lab::small_batch_linear;
using pagedattention_lab::small_batch_linears;

// engine/model.py's RMSNorm without a residual: weight * F.rms_norm(x.float(), (dim,), eps).to(x.dtype),
// the same ATen operators, so the same bits.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return weight * at::rms_norm(x.to(at::kFloat), {x.size(-1)}, std::nullopt, eps).to(x.scalar_type());
}

// engine/model.py's Linear on the kernel path: small_batch_linear, then the bias added in place.
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t n, const std::optional<at::Tensor>& bias) {
  at::Tensor y = small_batch_linear(x, packed, n);
  if (bias.has_value() && bias->defined()) y.add_(*bias);
  return y;
}

// Several Linears on the same x (q, k and v; gate and up) in one parallel region: each thread's share
// of the weights' panels runs on from one weight into the next instead of every weight starting and
// joining its own threads (small_batch_linears). The same tiles, so the same bits as one call each.
std::vector<at::Tensor> linears(const at::Tensor& x, at::TensorList packed, at::IntArrayRef ns, std::initializer_list<std::optional<at::Tensor>> biases) {
  std::vector<at::Tensor> ys = small_batch_linears(x, packed, ns);
  size_t i = 0;
  for (const auto& bias : biases) {
    if (bias.has_value() && bias->defined()) ys[i].add_(*bias);
    ++i;
  }
  return ys;
}

// The step's K and V rows into their slots: key_cache viewed as [num_blocks * block_size, num_kv_heads,
// head_dim] (the view engine/attention.py's write_kv_cache copies into), one row per token.
void write_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(key_cache.is_contiguous() && value_cache.is_contiguous() && key_cache.sizes() == value_cache.sizes(),
              "decode_layer: key_cache and value_cache must be contiguous [num_blocks, block_size, num_kv_heads, head_dim] alike");
  TORCH_CHECK(key_cache.size(2) == k.size(1) && key_cache.size(3) == k.size(2), "decode_layer: the caches are ", key_cache.sizes(),
              " but k is ", k.sizes());
  TORCH_CHECK(key_cache.scalar_type() == k.scalar_type(), "decode_layer: the caches are ", key_cache.scalar_type(), " but the model ",
              k.scalar_type());
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == k.size(0) && slot_mapping.scalar_type() == at::kLong,
              "decode_layer: slot_mapping must be [num_tokens] int64 with num_tokens = ", k.size(0));
  const at::Tensor kc = k.contiguous(), vc = v.contiguous(), slots = slot_mapping.contiguous();
  const int64_t num_slots = key_cache.size(0) * key_cache.size(1), row = kc.size(1) * kc.size(2) * kc.element_size();
  const int64_t* sp = slots.data_ptr<int64_t>();
  auto *kd = static_cast<char*>(key_cache.data_ptr()), *vd = static_cast<char*>(value_cache.data_ptr());
  const auto *ks = static_cast<const char*>(kc.data_ptr()), *vs = static_cast<const char*>(vc.data_ptr());
  for (int64_t i = 0; i < kc.size(0); ++i)  // all checked before anything is written
    TORCH_CHECK(sp[i] < num_slots, "decode_layer: slot_mapping[", i, "] = ", sp[i], " is not a slot of the pool (", num_slots, " slots)");
  for (int64_t i = 0; i < kc.size(0); ++i) {
    if (sp[i] < 0) continue;  // padding: never written
    std::memcpy(kd + sp[i] * row, ks + i * row, row);
    std::memcpy(vd + sp[i] * row, vs + i * row, row);
  }
}

}  // namespace

namespace pagedattention_lab {

std::tuple<at::Tensor, at::Tensor> decode_layer(const at::Tensor& hidden, const std::optional<at::Tensor>& residual, const at::Tensor& cos,
                                                const at::Tensor& sin, at::Tensor key_cache, at::Tensor value_cache, const at::Tensor& slot_mapping,
                                                const at::Tensor& block_tables, const at::Tensor& context_lens, at::TensorList weights,
                                                const c10::List<std::optional<at::Tensor>>& biases, at::IntArrayRef sizes, double scale,
                                                double eps) {
  TORCH_CHECK(weights.size() == 9 || weights.size() == 11, "decode_layer: weights must be the 9 of a layer (11 with q_norm and k_norm), got ",
              weights.size());
  TORCH_CHECK(biases.size() == 7, "decode_layer: biases must be 7 (one per projection, None for none), got ", biases.size());
  TORCH_CHECK(sizes.size() == 4, "decode_layer: sizes must be [num_heads, num_kv_heads, head_dim, intermediate_size], got ", sizes);
  TORCH_CHECK(hidden.dim() == 2 && hidden.size(0) > 0, "decode_layer: hidden must be [num_tokens, hidden_size] with num_tokens >= 1, got ",
              hidden.sizes());
  const int64_t n = hidden.size(0), hidden_size = hidden.size(1);
  const int64_t heads = sizes[0], kv_heads = sizes[1], dim = sizes[2], intermediate = sizes[3];
  auto bias = [&](int i) { return biases.get(i); };

  at::Tensor x, res;
  if (residual.has_value() && residual->defined()) {
    std::tie(x, res) = add_rms_norm(hidden, *residual, weights[0], eps);
  } else {  // the first layer: the residual stream starts as the embeddings
    res = hidden;
    x = rms_norm(hidden, weights[0], eps);
  }
  const std::vector<at::Tensor> qkv = linears(x, weights.slice(1, 3), {heads * dim, kv_heads * dim, kv_heads * dim}, {bias(0), bias(1), bias(2)});
  at::Tensor q = qkv[0].view({n, heads, dim}), k = qkv[1].view({n, kv_heads, dim});
  const at::Tensor v = qkv[2].view({n, kv_heads, dim});
  if (weights.size() == 11) {  // Qwen3
    q = rms_norm(q, weights[9], eps);
    k = rms_norm(k, weights[10], eps);
  }
  std::tie(q, k) = rotary_embedding(q, k, cos, sin);
  write_kv(k, v, key_cache, value_cache, slot_mapping);  // first, so attention reads this step's token too
  const at::Tensor attn = paged_attention_decode(q, key_cache, value_cache, block_tables, context_lens, scale, /*sliding_window=*/0);
  std::tie(x, res) = add_rms_norm(linear(attn.view({n, heads * dim}), weights[4], hidden_size, bias(3)), res, weights[5], eps);
  const std::vector<at::Tensor> gate_up = linears(x, weights.slice(6, 2), {intermediate, intermediate}, {bias(4), bias(5)});
  return {linear(silu_and_mul(gate_up[0], gate_up[1]), weights[8], hidden_size, bias(6)), res};
}

// Every decoder layer of a decode step, then the final RMSNorm, in one call: decode_layer for layer
// 0, 1, ..., with weights and biases the layers' lists one after another (9 or 11 weights and 7 biases
// per layer), key_caches[i] and value_caches[i] layer i's pools. Returns the final hidden states
// [num_tokens, hidden_size], as CausalLM.forward does.
//
// Why, on top of decode_layer: a step streams each layer's weights (14 MB for SmolLM2-135M) through the
// caches, and the Python that runs between two layer calls then finds its own data evicted: the first
// small operator after streaming took ~90 us here against ~5 us warm. One call for all layers runs no
// Python between them.
at::Tensor decode_layers(const at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin, at::TensorList key_caches,
                         at::TensorList value_caches, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                         const at::Tensor& context_lens, at::TensorList weights, const c10::List<std::optional<at::Tensor>>& biases,
                         at::IntArrayRef sizes, double scale, double eps, const at::Tensor& norm_weight, double norm_eps) {
  const int64_t layers = static_cast<int64_t>(key_caches.size());
  TORCH_CHECK(layers > 0 && value_caches.size() == key_caches.size(),
              "decode_layers: key_caches and value_caches must be one per layer (at least one), got ", key_caches.size(), " and ",
              value_caches.size());
  const int64_t per_layer = static_cast<int64_t>(weights.size()) / layers;
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == per_layer * layers && (per_layer == 9 || per_layer == 11),
              "decode_layers: weights must be 9 (or 11 with q_norm and k_norm) per layer, one layer after another; got ", weights.size(),
              " for ", layers, " layers");
  TORCH_CHECK(static_cast<int64_t>(biases.size()) == 7 * layers, "decode_layers: biases must be 7 per layer, got ", biases.size(), " for ",
              layers, " layers");
  for (int64_t i = 0; i < layers; ++i)  // before anything is written: every layer's pools like the first's
    TORCH_CHECK(key_caches[i].sizes() == key_caches[0].sizes() && value_caches[i].sizes() == key_caches[0].sizes() &&
                    key_caches[i].scalar_type() == key_caches[0].scalar_type() && value_caches[i].scalar_type() == key_caches[0].scalar_type(),
                "decode_layers: layer ", i, "'s key_cache and value_cache must have layer 0's shape and dtype ", key_caches[0].sizes());
  at::Tensor h = hidden, res;
  std::optional<at::Tensor> residual;
  for (int64_t i = 0; i < layers; ++i) {
    c10::List<std::optional<at::Tensor>> layer_biases;
    for (int64_t j = 0; j < 7; ++j) layer_biases.push_back(biases.get(7 * i + j));
    std::tie(h, res) = decode_layer(h, residual, cos, sin, key_caches[i], value_caches[i], slot_mapping, block_tables, context_lens,
                                    weights.slice(per_layer * i, per_layer), layer_biases, sizes, scale, eps);
    residual = res;
  }
  return std::get<0>(add_rms_norm(h, res, norm_weight, norm_eps));
}

}  // namespace pagedattention_lab

TORCH_LIBRARY_FRAGMENT(pagedattention_lab, m) {
  m.def(
      "decode_layer(Tensor hidden, Tensor? residual, Tensor cos, Tensor sin, Tensor(a!) key_cache, Tensor(b!) value_cache, "
      "Tensor slot_mapping, Tensor block_tables, Tensor context_lens, Tensor[] weights, Tensor?[] biases, int[] sizes, float scale, "
      "float eps) -> (Tensor, Tensor)");
  m.def(
      "decode_layers(Tensor hidden, Tensor cos, Tensor sin, Tensor(a!)[] key_caches, Tensor(b!)[] value_caches, Tensor slot_mapping, "
      "Tensor block_tables, Tensor context_lens, Tensor[] weights, Tensor?[] biases, int[] sizes, float scale, float eps, "
      "Tensor norm_weight, float norm_eps) -> Tensor");
}

TORCH_LIBRARY_IMPL(pagedattention_lab, CPU, m) {
  m.impl("decode_layer", &pagedattention_lab::decode_layer);
  m.impl("decode_layers", &pagedattention_lab::decode_layers);
}
