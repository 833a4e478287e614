"""The engine's own forward pass for Llama-family models (Llama, SmolLM, TinyLlama, Qwen2, Qwen3) and Gemma 3.

Decoder layer: RMSNorm -> grouped-query attention with rotary position embedding, reading and writing
K and V only through the paged KV cache -> residual -> RMSNorm -> SwiGLU MLP -> residual.
Qwen2 adds a bias to the Q/K/V projections; Qwen3 normalises each head's Q and K (RMSNorm over
head_dim) before the rotation. Parameter names follow Hugging Face's, so a checkpoint loads with
a strict name-by-name check (:func:`build_model`).

Gemma 3 (``model_type`` ``gemma3_text``; Gemma 3 technical report, arXiv:2503.19786, §2) differs in
these places, each where the part lives: embeddings scaled by ``sqrt(hidden_size)``; RMSNorm weights
stored as ``w`` and applied as ``1 + w``, in fp32; four norms per layer (after attention and after the MLP
too, before each residual add); Q and K normalised per head; GeGLU (tanh-approximated GELU) in place
of SwiGLU; queries scaled by ``query_pre_attn_scalar ** -0.5``; and layers of two kinds, five
sliding-window layers (a query sees the last ``sliding_window`` positions, itself included, RoPE base
10,000) to one full-attention layer (RoPE base 1,000,000). :attr:`CausalLM.layer_types` and
:attr:`CausalLM.sliding_windows` say which layer is which, by Hugging Face's names.

Tokens of all requests in a step are packed into one flat batch, ``[num_tokens, ...]`` with no padding:
prefill tokens first, then one token per decoding request (vLLM's layout). The
:class:`AttentionMetadata` tells attention where each token's K and V go (``slot_mapping``) and
which blocks each request reads (``block_tables``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from engine.cpu import ops as cpu_ops
from engine.model_executor import kv_quant

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "gemma3_text")
FULL_ATTENTION, SLIDING_ATTENTION = "full_attention", "sliding_attention"  # Hugging Face's config.layer_types


def layer_types(config) -> list[str]:
    """Each layer's attention type, by Hugging Face's names (``config.layer_types``): ``"full_attention"`` or
    ``"sliding_attention"``; all full where the config names none.

    Raises:
        WeightLoadError: a type the engine's attention does not run (chunked or linear attention), or a
            config that turns a sliding window on without saying which layers have it.
    """
    types = getattr(config, "layer_types", None)
    if not types:
        if getattr(config, "use_sliding_window", False):
            raise WeightLoadError("the config turns sliding-window attention on (use_sliding_window) but names no layer_types")
        return [FULL_ATTENTION] * config.num_hidden_layers
    types = list(types)
    unknown = sorted(set(types) - {FULL_ATTENTION, SLIDING_ATTENTION})
    if unknown or len(types) != config.num_hidden_layers:
        raise WeightLoadError(f"layer_types must name {config.num_hidden_layers} layers of {FULL_ATTENTION!r} or {SLIDING_ATTENTION!r}; "
                              f"the config has {len(types)}{', with ' + ', '.join(map(repr, unknown)) if unknown else ''}")
    if SLIDING_ATTENTION in types and not getattr(config, "sliding_window", None):
        raise WeightLoadError("the config has sliding-window layers but no positive sliding_window")
    return types


def sliding_windows(config) -> list[int | None]:
    """Each layer's ``sliding_window`` in tokens (a query at position p sees keys p - sliding_window + 1 .. p,
    as Hugging Face's mask and vLLM's attention do), None for a full-attention layer."""
    return [int(config.sliding_window) if kind == SLIDING_ATTENTION else None for kind in layer_types(config)]


class WeightLoadError(ValueError):
    """A checkpoint's tensors do not match the model: names the missing, unexpected or mis-shaped ones."""


@dataclass
class AttentionBackend:
    """The three attention operations and the block copy, from engine/model_executor/attention.py (torch) or paged_kernels/ (Triton).

    ``plan``, when a backend has one, runs once per step on the step's metadata and returns what its
    operations would otherwise recompute in every layer (the torch backend: block tables translated
    to slots); ``write_kv`` and ``decode`` then receive it as ``plan=``.
    """

    name: str
    write_kv: Callable  # (key, value, key_cache, value_cache, slot_mapping[, plan])
    # prefill, decode and prefill_varlen take sliding_window= (tokens) too; it is passed only for a sliding-window layer
    prefill: Callable  # (query, key_cache, value_cache, block_tables, context_lens, query_start_loc, scale)
    decode: Callable  # (query, key_cache, value_cache, block_tables, context_lens, scale[, plan])
    plan: Callable | None = None  # (slot_mapping, decode_block_tables, decode_context_lens, block_size) -> plan
    copy_blocks: Callable | None = None  # (key_caches, value_caches, block_mapping [num_pairs, 2] int64)
    # write_kv is a plain copy into the pools and decode the engine's C++ kernel, so a decode step's
    # layers may each run as one C++ call that does both (engine.cpu.ops.decode_layer).
    cpu_decode_layer: bool = False
    # (query, key, value, query_start_loc, scale): a step whose prefills have nothing cached before them
    # may read their K and V as computed (attention.prefill_varlen_reference); None: always ``prefill``.
    prefill_varlen: Callable | None = None


@dataclass
class AttentionMetadata:
    """Where one step's tokens live in the paged KV cache.

    Attributes:
        slot_mapping: ``[num_tokens]`` int64, the slot each token's K and V are written to (-1: none).
        num_prefill_tokens: the first this many tokens belong to prefills, the rest are decodes.
        prefill_query_start_loc: ``[num_prefills + 1]`` int32, cumulative prompt lengths.
        prefill_context_lens, decode_context_lens: ``[num_prefills]`` / ``[num_decodes]`` int32, tokens
            in the cache per request after this step's write.
        prefill_block_tables, decode_block_tables: ``[num_*, max_blocks]`` int32.
        backend: which attention implementation runs.
        plan: what ``backend.plan`` precomputed for this step (None: the backend has no plan).
        prefills_from_scratch: every prefill of the step starts at position 0 (nothing of its prompt
            is in the cache yet: no prefix-cache hit, no earlier chunk), so ``backend.prefill_varlen``
            may run instead of ``backend.prefill``.
        layer_metadata: a hybrid model's (several KV cache groups, ``engine/core/kv_cache_coordinator.py``):
            layer i's metadata, its group's slot mapping and block tables; None: every layer reads this one.
    """

    slot_mapping: torch.Tensor
    num_prefill_tokens: int
    prefill_query_start_loc: torch.Tensor
    prefill_context_lens: torch.Tensor
    prefill_block_tables: torch.Tensor
    decode_context_lens: torch.Tensor
    decode_block_tables: torch.Tensor
    backend: AttentionBackend
    plan: object | None = None
    prefills_from_scratch: bool = False
    layer_metadata: list[AttentionMetadata] | None = None


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same names, same ``[out, in]`` weight) whose decode-sized calls on
    CPU can go through the engine's small-batch kernel (:func:`engine.cpu.ops.small_batch_linear`).

    ``cpu_kernel`` is False until :meth:`CausalLM.use_cpu_kernels` sets it, with ``packed_weight``
    (the weight in the kernel's panels, :func:`engine.cpu.ops.pack_weight`) and ``kernel_max_rows``
    (:func:`engine.cpu.ops.kernel_max_rows`): then every input ``[M, in]`` with 1 <= M <= kernel_max_rows
    rows (any M when None) goes through the kernel, decode steps and prefills alike, when no gradient is
    being recorded (the engine runs under ``torch.inference_mode()``); anything else goes through
    ``F.linear`` (on Intel CPUs, prefills of more than 64 tokens: MKL is faster there).
    """

    cpu_kernel: bool = False
    packed_weight: torch.Tensor | None = None
    kernel_max_rows: int | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if (self.cpu_kernel and x.dim() == 2 and rows > 0 and (self.kernel_max_rows is None or rows <= self.kernel_max_rows)
                and not torch.is_grad_enabled()):
            y = cpu_ops.small_batch_linear(x, self.weight, self.packed_weight)
            return y if self.bias is None else y.add_(self.bias)
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 (as Llama does), then scaled by a learned weight.

    Gemma's norms (``offset=1.0``) store ``w`` and scale by ``1 + w``, and cast to the model dtype after the
    scaling, not before (Hugging Face's ``Gemma3RMSNorm``).

    ``norm(x)`` returns the normalised ``x``. ``norm(x, residual)`` first adds the sub-layer output ``x``
    to the residual stream and returns ``(norm(x + residual), x + residual)`` (vLLM's layout: the
    residual connection of one sub-layer and the norm in front of the next are one step, and one
    C++ call when ``cpu_kernel`` is set, see :func:`engine.cpu.ops.add_rms_norm`). With ``cpu_kernel``,
    no gradients and contiguous inputs, the two results are written over ``x`` and ``residual`` and
    those tensors returned (:func:`engine.cpu.ops.add_rms_norm_`, vLLM's ``fused_add_rms_norm``, which
    works in place): a prefill's hidden states are megabytes, and fresh outputs cost memory traffic.
    """

    cpu_kernel: bool = False

    def __init__(self, dim: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return self._norm(x)
        if self.cpu_kernel and x.dim() == 2 and not torch.is_grad_enabled():
            if x.is_contiguous() and residual.is_contiguous():  # both are this layer's own: written in place, as vLLM does
                return cpu_ops.add_rms_norm_(x, residual, self.weight, self.eps)
            return cpu_ops.add_rms_norm(x, residual, self.weight, self.eps)
        residual = x + residual
        return self._norm(residual), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm without a weight is Llama's x * rsqrt(mean(x**2) + eps), the same operations in
        # the same order (bit-identical), dispatched as one call instead of five from Python.
        normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        if self.offset:
            return (normed * (self.offset + self.weight.float())).to(x.dtype)
        return self.weight * normed.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoFormer), with the rope scaling a config names (llama3, linear, yarn...).

    Angles are computed in fp32 whatever the model dtype, as transformers does, so that logits match.

    Gemma 3's two kinds of layer each have their own (``layer_type``: their RoPE base and scaling).
    """

    def __init__(self, config, head_dim: int, layer_type: str = FULL_ATTENTION):
        super().__init__()
        params = _rope_parameters(config, layer_type)
        rope_type = params.get("rope_type", "default")
        if rope_type == "default":
            inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
            self.attention_scaling = 1.0
        else:
            per_type = {"layer_type": layer_type} if _per_layer_type(config) else {}
            inv_freq, self.attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"), **per_type)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions ``[num_tokens]`` int64 -> cos, sin ``[num_tokens, 1, head_dim]`` in ``dtype``."""
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.attention_scaling).to(dtype)
        sin = (emb.sin() * self.attention_scaling).to(dtype)
        return cos[:, None, :], sin[:, None, :]


def _per_layer_type(config) -> bool:
    """The config's ``rope_parameters`` hold one entry per layer type (Gemma 3's, transformers 5)."""
    params = getattr(config, "rope_parameters", None) or {}
    return isinstance(params.get(FULL_ATTENTION), dict)


def _rope_parameters(config, layer_type: str = FULL_ATTENTION) -> dict:
    params = getattr(config, "rope_parameters", None)
    if params and _per_layer_type(config):
        return dict(params[layer_type])
    if params:
        return dict(params)
    params = dict(getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_type", params.pop("type", "default"))
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    if layer_type == SLIDING_ATTENTION and getattr(config, "rope_local_base_freq", None):  # Gemma 3, transformers 4
        params = {"rope_type": "default", "rope_theta": config.rope_local_base_freq}
    return params


def _per_rope(config) -> bool:
    """Sliding-window layers have a RoPE of their own (Gemma 3's local base)."""
    return _per_layer_type(config) or bool(getattr(config, "rope_local_base_freq", None))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE: x ``[num_tokens, heads, head_dim]``, cos/sin ``[num_tokens, 1, head_dim]`` -> x rotated, same shape."""
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    """Grouped-query self-attention over the paged KV cache (num_heads query heads share num_kv_heads K/V heads).

    ``sliding_window`` (tokens, None: full attention): a query at position p attends to positions
    p - sliding_window + 1 .. p only; the backend skips the blocks wholly before that.
    """

    def __init__(self, config, head_dim: int, sliding_window: int | None = None):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim
        self.sliding_window = sliding_window
        self.scale = (getattr(config, "query_pre_attn_scalar", None) or head_dim) ** -0.5
        bias = config.model_type == "qwen2" or getattr(config, "attention_bias", False)
        hidden = config.hidden_size
        self.q_proj = Linear(hidden, self.num_heads * head_dim, bias=bias)
        self.k_proj = Linear(hidden, self.num_kv_heads * head_dim, bias=bias)
        self.v_proj = Linear(hidden, self.num_kv_heads * head_dim, bias=bias)
        self.o_proj = Linear(self.num_heads * head_dim, hidden, bias=getattr(config, "attention_bias", False))
        if config.model_type in ("qwen3", "gemma3_text"):
            offset = 1.0 if config.model_type == "gemma3_text" else 0.0
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps, offset)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps, offset)
        self.cpu_kernel = False  # RoPE on q and k in one C++ call (engine.cpu.ops.rotary_embedding)

    # An fp8 KV cache's per-tensor scales (vLLM's Attention._k_scale_float, _v_scale_float): K is stored as
    # fp8(K / k_scale) and read as fp8 * k_scale (engine/model_executor/kv_quant.py). calculate_kv_scales: set
    # them from the first forward pass's K and V, once (vLLM's calculate_kv_scales).
    k_scale: float = 1.0
    v_scale: float = 1.0
    calculate_kv_scales: bool = False

    def forward(self, x, cos, sin, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata):
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(n, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        if self.cpu_kernel and not torch.is_grad_enabled():
            q, k = cpu_ops.rotary_embedding(q, k, cos, sin)  # exactly the two lines below, in one call
        else:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        key_cache, value_cache = kv_cache
        scales = {}  # an fp8 pool's k_scale and v_scale, for every operation that writes or reads it
        if kv_quant.is_fp8(key_cache.dtype):
            if self.calculate_kv_scales:
                self.k_scale, self.v_scale = kv_quant.compute_kv_scales(k, v)
                self.calculate_kv_scales = False
            scales = {"k_scale": self.k_scale, "v_scale": self.v_scale}
        # Written first, so attention reads every token, including this step's, through the block table.
        plan = {} if meta.plan is None else {"plan": meta.plan}
        meta.backend.write_kv(k, v, key_cache, value_cache, meta.slot_mapping, **plan, **scales)
        window = {} if self.sliding_window is None else {"sliding_window": self.sliding_window}
        p = meta.num_prefill_tokens
        if not 0 <= p <= n or n == 0:
            raise ValueError(f"a batch of {n} query tokens with {p} prefill tokens: the scheduler gave the model nothing to compute")
        parts = []  # the prefill tokens' attention, then the decode tokens'
        # An fp8 prompt attends to its K and V as the pool holds them (quantized), as vLLM's paged kernels do:
        # never to this step's unquantized projections.
        if p > 0 and meta.prefills_from_scratch and meta.backend.prefill_varlen is not None and not scales:
            parts.append(meta.backend.prefill_varlen(q[:p], k[:p], v[:p], meta.prefill_query_start_loc, self.scale, **window))
        elif p > 0:
            parts.append(meta.backend.prefill(
                q[:p], key_cache, value_cache, meta.prefill_block_tables,
                meta.prefill_context_lens, meta.prefill_query_start_loc, self.scale, **window, **scales,
            ))
        if p < n:
            parts.append(meta.backend.decode(
                q[p:], key_cache, value_cache, meta.decode_block_tables, meta.decode_context_lens, self.scale, **plan, **window, **scales
            ))
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self.o_proj(out.view(n, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)); Gemma's GeGLU: down(gelu_tanh(gate(x)) * up(x))."""

    def __init__(self, config):
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        self.gelu = getattr(config, "hidden_activation", None) == "gelu_pytorch_tanh"
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=bias)

    cpu_kernel: bool = False  # silu(gate) * up through engine.cpu.ops.silu_and_mul, see CausalLM.use_cpu_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.gelu:
            return self.down_proj(F.gelu(gate, approximate="tanh") * up)
        if self.cpu_kernel and not torch.is_grad_enabled():  # the gate projection, not read again, takes the result
            return self.down_proj(cpu_ops.silu_and_mul_(gate, up) if gate.is_contiguous() else cpu_ops.silu_and_mul(gate, up))
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """One transformer block. Takes and returns ``(hidden, residual)`` (vLLM's layout): the block's input is
    ``hidden + residual`` (``residual`` None: ``hidden`` alone, in the first layer), and so is its output.
    Each residual add happens inside the RMSNorm that follows it, see :class:`RMSNorm`. With the CPU
    kernels, and no gradients, that RMSNorm writes its results over its two inputs, as vLLM's
    ``fused_add_rms_norm`` does: a call overwrites the ``hidden`` and ``residual`` it is given (pass copies
    to keep them).

    Gemma's layers norm each sub-layer's output too before it joins the residual stream
    (``post_attention_layernorm``, ``post_feedforward_layernorm``); its MLP's input norm is
    ``pre_feedforward_layernorm``.
    """

    def __init__(self, config, head_dim: int, sliding_window: int | None = None):
        super().__init__()
        gemma = config.model_type == "gemma3_text"
        offset = 1.0 if gemma else 0.0
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, offset)
        self.self_attn = Attention(config, head_dim, sliding_window)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, offset)
        if gemma:
            self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, offset)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, offset)
        self.mlp = MLP(config)

    decode_weights: tuple | None = None  # (weights, biases, sizes, scale, eps) for engine.cpu.ops.decode_layer, see CausalLM.use_cpu_kernels

    def forward(self, hidden, residual, cos, sin, kv_cache, meta):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, cos, sin, kv_cache, meta)
        if hasattr(self, "pre_feedforward_layernorm"):
            hidden, residual = self.pre_feedforward_layernorm(self.post_attention_layernorm(hidden), residual)
            return self.post_feedforward_layernorm(self.mlp(hidden)), residual
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    def decode(self, hidden, residual, cos, sin, kv_cache, meta):
        """:meth:`forward` for a step of decode tokens only, as one C++ call (:func:`engine.cpu.ops.decode_layer`;
        the same kernels in the same order, so the same results). Only once ``decode_weights`` is set."""
        weights, biases, sizes, scale, eps = self.decode_weights
        return cpu_ops.decode_layer(hidden, residual, cos, sin, *kv_cache, meta.slot_mapping, meta.decode_block_tables,
                                    meta.decode_context_lens, weights, biases, sizes, scale, eps)

    def store_decode_weights(self) -> None:
        """Collect what :meth:`decode` passes to C++: the norms' weights, the projections' packed weights
        and biases, the head sizes. Call once every projection has its ``packed_weight``."""
        attn, mlp = self.self_attn, self.mlp
        projections = [attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj]
        packed = [p.packed_weight for p in projections]
        weights = [self.input_layernorm.weight, *packed[:4], self.post_attention_layernorm.weight, *packed[4:]]
        norms = [self.input_layernorm, self.post_attention_layernorm]
        if hasattr(attn, "q_norm"):
            weights += [attn.q_norm.weight, attn.k_norm.weight]
            norms += [attn.q_norm, attn.k_norm]
        if len({n.eps for n in norms}) != 1:
            raise ValueError("decode_layer takes one eps for all of a layer's RMSNorms; this layer's differ")
        sizes = [attn.num_heads, attn.num_kv_heads, attn.head_dim, mlp.gate_proj.out_features]
        self.decode_weights = (weights, [p.bias for p in projections], sizes, attn.scale, norms[0].eps)


class Backbone(nn.Module):
    def __init__(self, config, head_dim: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, head_dim, window) for window in sliding_windows(config))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, 1.0 if config.model_type == "gemma3_text" else 0.0)


class CausalLM(nn.Module):
    """A decoder-only language model whose attention goes through the engine's paged KV cache.

    Args:
        config: a transformers ``LlamaConfig`` / ``Qwen2Config`` / ``Qwen3Config`` / ``Gemma3TextConfig``.

    Attributes (besides the modules):
        layer_types: ``[num_layers]`` each layer's attention, by Hugging Face's names: ``"full_attention"``
            or ``"sliding_attention"`` (what a hybrid KV cache groups layers by, vLLM's ``FullAttentionSpec``
            and ``SlidingWindowSpec``).
        sliding_windows: ``[num_layers]`` each layer's ``sliding_window`` in tokens, None for full attention
            (also each layer's ``self_attn.sliding_window``).
        embed_scale: what the embeddings are multiplied by (Gemma: ``sqrt(hidden_size)``), else None.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = config.num_key_value_heads
        self.layer_types = layer_types(config)
        self.sliding_windows = sliding_windows(config)
        self.embed_scale = config.hidden_size**0.5 if config.model_type == "gemma3_text" else None
        self.final_logit_softcapping = getattr(config, "final_logit_softcapping", None)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.model = Backbone(config, self.head_dim)
        self.rotary_emb = RotaryEmbedding(config, self.head_dim)
        # Sliding-window layers with a RoPE of their own (Gemma 3: base 10,000 against the full layers' 1,000,000).
        self.rotary_emb_local = (RotaryEmbedding(config, self.head_dim, SLIDING_ATTENTION)
                                 if SLIDING_ATTENTION in self.layer_types and _per_rope(config) else None)
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.lm_head_t: torch.Tensor | None = None  # [hidden_size, vocab_size] on CPU, see store_lm_head_transposed
        self.cpu_kernels = False  # the LM head goes through engine.cpu.ops too, see use_cpu_kernels
        self.lm_head_packed: torch.Tensor | None = None  # the LM head in the kernel's panels, see use_cpu_kernels
        self.decode_layers = False  # decode steps run each layer as one C++ call (DecoderLayer.decode), see use_cpu_kernels
        self.layers_decode_weights: tuple | None = None  # all layers' decode_weights for cpu_ops.decode_layers, see use_cpu_kernels
        self._hook_dicts: list[dict] = []  # the forward (pre-)hook dicts of every module inside the layers, see _watched

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """input_ids, positions ``[num_tokens]`` int64 -> final hidden states ``[num_tokens, hidden_size]``.

        ``kv_caches[i]`` is layer i's (key_cache, value_cache), each
        ``[num_blocks, block_size, num_kv_heads, head_dim]``; this step's K and V are written into them.
        """
        hidden = self.model.embed_tokens(input_ids)
        if self.embed_scale is not None:  # a 0-d tensor in the weights' dtype, as Hugging Face's Gemma multiplies
            hidden = hidden * torch.tensor(self.embed_scale, dtype=hidden.dtype)
        cos, sin = self.rotary_emb(positions, hidden.dtype)
        local = None if self.rotary_emb_local is None else self.rotary_emb_local(positions, hidden.dtype)
        residual = None
        # The one-call C++ decode layers write and read pools of the model's dtype: an fp8 pool goes layer by layer.
        one_call = (self.decode_layers and meta.backend.cpu_decode_layer and meta.num_prefill_tokens == 0
                    and meta.layer_metadata is None and not kv_quant.is_fp8(kv_caches[0][0].dtype)
                    and hidden.shape[0] > 0 and not torch.is_grad_enabled() and not self._watched())
        if one_call and self.layers_decode_weights is not None:  # all layers and the final norm in one C++ call
            weights, biases, sizes, scale, eps = self.layers_decode_weights
            norm = self.model.norm
            return cpu_ops.decode_layers(hidden, cos, sin, kv_caches, meta.slot_mapping, meta.decode_block_tables, meta.decode_context_lens,
                                         weights, biases, sizes, scale, eps, norm.weight, norm.eps)
        for i, (layer, kv_cache, kind) in enumerate(zip(self.model.layers, kv_caches, self.layer_types)):
            layer_cos, layer_sin = local if local is not None and kind == SLIDING_ATTENTION else (cos, sin)
            layer_meta = meta if meta.layer_metadata is None else meta.layer_metadata[i]
            hidden, residual = (layer.decode if one_call else layer)(hidden, residual, layer_cos, layer_sin, kv_cache, layer_meta)
        return self.model.norm(hidden, residual)[0]

    def _all_decode_weights(self) -> tuple | None:
        """Every layer's ``decode_weights`` as one (weights, biases, sizes, scale, eps) for
        :func:`engine.cpu.ops.decode_layers`: the lists one layer after another. None where the layers'
        sizes, scales or epsilons differ (then each layer is its own call)."""
        per_layer = [layer.decode_weights for layer in self.model.layers]
        if len({(tuple(sizes), scale, eps) for _, _, sizes, scale, eps in per_layer}) != 1:
            return None
        _, _, sizes, scale, eps = per_layer[0]
        return [w for p in per_layer for w in p[0]], [b for p in per_layer for b in p[1]], sizes, scale, eps

    def _watched(self) -> bool:
        """A forward hook is registered on a module inside the layers (the app's Kernel lab keeps each
        q_proj's output), or globally: then decode steps run the modules, so that the hooks see them.

        The modules' hook dictionaries are listed once (:meth:`use_cpu_kernels`; registering or removing
        a hook changes a dictionary in place, never replaces it), and ``any`` tests them in one C loop:
        ~800 for the default model. Asked for each module by attribute, as before, the same test took
        0.34 ms of a 15 ms decode step here, its data cold after the step had streamed the weights.
        """
        from torch.nn.modules import module as nn_module

        return bool(nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks) or any(self._hook_dicts)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[n, hidden_size]`` -> logits ``[n, vocab_size]`` in fp32 (soft-capped where the config says so:
        ``cap * tanh(logits / cap)``, Gemma 2's ``final_logit_softcapping``)."""
        weight = self.model.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight
        if self.cpu_kernels and hidden.shape[0] > 0 and not torch.is_grad_enabled():
            logits = cpu_ops.small_batch_linear(hidden, weight, self.lm_head_packed).float()
        elif self.lm_head_t is not None:
            logits = (hidden @ self.lm_head_t).float()
        else:
            logits = F.linear(hidden, weight).float()
        if self.final_logit_softcapping:
            logits = torch.tanh(logits / self.final_logit_softcapping) * self.final_logit_softcapping
        return logits

    def store_lm_head_transposed(self) -> None:
        """Keep the LM head in memory as ``[hidden_size, vocab_size]`` (row-major K x N) instead of
        ``[vocab_size, hidden_size]``; the module's weight becomes a transposed view of it (no second copy).

        Why (CPU only): the LM head is the largest matrix multiplication of a decode step (vocab 49152 x
        hidden 576 for SmolLM2), and MKL's sgemm reading an N x K weight through a transpose is up to
        ~2x slower for batches of 2-15 rows than with the K x N layout (measured on a 2-core Xeon:
        13 rows 17.6 vs 11.7 ms). For MKL the layers' projections showed no steady difference either way,
        so they keep PyTorch's layout. The tied embedding is looked up through the same memory. Used
        when the engine's own kernel (:meth:`use_cpu_kernels`) is not, which reads ``[vocab_size,
        hidden_size]`` as it is.
        """
        head = self.model.embed_tokens if self.tie_word_embeddings else self.lm_head
        self.lm_head_t = head.weight.detach().t().contiguous()
        head.weight = nn.Parameter(self.lm_head_t.t(), requires_grad=False)

    def use_cpu_kernels(self) -> None:
        """Run the engine's C++ CPU kernels (:mod:`engine.cpu.ops`) instead of torch where they apply:
        matmuls in every projection (up to :func:`engine.cpu.ops.kernel_max_rows` rows) and the LM head (each weight packed once into the
        kernel's panels, :func:`engine.cpu.ops.pack_weights`, shared with other models built on the same
        weights; only where the kernel was built for AVX-512 or AVX2, see :func:`engine.cpu.ops.supports`), the
        residual add with RMSNorm, RoPE, and SwiGLU's
        silu-and-multiply. When every projection takes the kernel, a step of decode tokens only runs each
        decoder layer as one C++ call (:meth:`DecoderLayer.decode`, :func:`engine.cpu.ops.decode_layer`),
        with a backend that allows it (``cpu_decode_layer``) and no forward hook inside the layers (then
        the modules run, so that the hooks see them). Only while no gradient is recorded: under autograd
        every module runs its torch code.

        Call only on float32 or bfloat16 CPU weights, after :func:`engine.cpu.ops.load_kernel` returned True.
        In bfloat16 the matmuls only where :func:`engine.cpu.ops.matmul_bf16` (AVX512-BF16).
        A weight that is not contiguous (none is, after a normal load) is made so first.
        """
        for module in self.modules():
            if isinstance(module, Linear):
                if not module.weight.is_contiguous():
                    module.weight = nn.Parameter(module.weight.detach().contiguous(), requires_grad=False)
                module.cpu_kernel = cpu_ops.supports(module.weight)
                module.kernel_max_rows = cpu_ops.kernel_max_rows(module.weight)
            elif isinstance(module, (RMSNorm, Attention)):  # the C++ norm has no Gemma offset
                module.cpu_kernel = self.model.norm.weight.dtype in (torch.float32, torch.bfloat16) and not getattr(module, "offset", 0.0)
            elif isinstance(module, MLP):
                module.cpu_kernel = module.gate_proj.weight.dtype in (torch.float32, torch.bfloat16) and not module.gelu
        head = self.model.embed_tokens if self.tie_word_embeddings else self.lm_head
        if not head.weight.is_contiguous():
            head.weight = nn.Parameter(head.weight.detach().contiguous(), requires_grad=False)
        self.cpu_kernels = cpu_ops.supports(head.weight)
        linears = [m for m in self.modules() if isinstance(m, Linear) and m.cpu_kernel]
        weights = [m.weight for m in linears] + ([head.weight] if self.cpu_kernels else [])
        packed = cpu_ops.pack_weights(weights) if weights else []
        for module, p in zip(linears, packed):
            module.packed_weight = p
        self.lm_head_packed = packed[-1] if self.cpu_kernels else None
        layers = self.model.layers
        # decode_layer's C++ layer is Llama's: no sliding window, no Gemma norms (whose cpu_kernel is False)
        self.decode_layers = (all(m.cpu_kernel for layer in layers for m in layer.modules() if isinstance(m, (Linear, RMSNorm, Attention, MLP)))
                              and all(window is None for window in self.sliding_windows))
        for layer in layers if self.decode_layers else []:
            layer.store_decode_weights()
        self.layers_decode_weights = self._all_decode_weights() if self.decode_layers else None
        self._hook_dicts = [d for layer in layers for m in layer.modules() for d in (m._forward_hooks, m._forward_pre_hooks)]


def build_model(
    config, state_dict: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, cpu_kernels: bool = False
) -> CausalLM:
    """Build :class:`CausalLM` for ``config`` and load ``state_dict`` into it, strictly.

    Args:
        config: transformers config of model_type llama, qwen2 or qwen3.
        state_dict: Hugging Face tensor names -> tensors (any float dtype; converted to ``dtype``).
        dtype, device: where the weights live.
        cpu_kernels: float32 or bfloat16 on CPU only: the engine's C++ kernels replace torch where they
            apply (:meth:`CausalLM.use_cpu_kernels`) when they build; otherwise (or False) all is torch.

    Raises:
        WeightLoadError: a tensor is missing, unexpected or of the wrong shape (all are named), or the
            model type is not supported. A loader that silently kept a randomly initialised layer would
            produce fluent nonsense that nothing else notices.
    """
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise WeightLoadError(f"model_type {config.model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}")
    if getattr(config, "attn_logit_softcapping", None):
        raise WeightLoadError("attention logit soft-capping (Gemma 2's attn_logit_softcapping) is not supported")
    with torch.device("meta"):
        model = CausalLM(config)
    state_dict = dict(state_dict)
    if model.tie_word_embeddings:
        state_dict.pop("lm_head.weight", None)  # some checkpoints store the tied copy too
    _check_tensors(model, state_dict)
    state_dict = {name: t.to(device=device, dtype=dtype) for name, t in state_dict.items()}
    model.load_state_dict(state_dict, strict=True, assign=True)
    model.rotary_emb = RotaryEmbedding(config, model.head_dim).to(device)
    if model.rotary_emb_local is not None:
        model.rotary_emb_local = RotaryEmbedding(config, model.head_dim, SLIDING_ATTENTION).to(device)
    if device.type == "cpu":
        if cpu_kernels and dtype in (torch.float32, torch.bfloat16) and cpu_ops.load_kernel():
            model.use_cpu_kernels()
        else:
            model.store_lm_head_transposed()
    return model.eval()


def _check_tensors(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mismatched = [
        f"{name}: checkpoint {tuple(state_dict[name].shape)}, model {shape}"
        for name, shape in expected.items()
        if name in state_dict and tuple(state_dict[name].shape) != shape
    ]
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(unexpected)}")
    if mismatched:
        problems.append(f"mis-shaped tensors: {'; '.join(mismatched)}")
    if problems:
        raise WeightLoadError("checkpoint does not match the model — " + " | ".join(problems))
