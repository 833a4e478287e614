"""The engine's own forward pass for Llama-family models (Llama, SmolLM, TinyLlama, Qwen2, Qwen3).

Decoder layer: RMSNorm -> grouped-query attention with rotary position embedding, reading and writing
K and V only through the paged KV cache -> residual -> RMSNorm -> SwiGLU MLP -> residual.
Qwen2 adds a bias to the Q/K/V projections; Qwen3 normalises each head's Q and K (RMSNorm over
head_dim) before the rotation. Parameter names follow Hugging Face's, so a checkpoint loads with
a strict name-by-name check (:func:`build_model`).

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

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


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

    ``norm(x)`` returns the normalised ``x``. ``norm(x, residual)`` first adds the sub-layer output ``x``
    to the residual stream and returns ``(norm(x + residual), x + residual)`` (vLLM's layout: the
    residual connection of one sub-layer and the norm in front of the next are one step, and one
    C++ call when ``cpu_kernel`` is set, see :func:`engine.cpu.ops.add_rms_norm`).
    """

    cpu_kernel: bool = False

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return self._norm(x)
        if self.cpu_kernel and x.dim() == 2 and not torch.is_grad_enabled():
            return cpu_ops.add_rms_norm(x, residual, self.weight, self.eps)
        residual = x + residual
        return self._norm(residual), residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # F.rms_norm without a weight is Llama's x * rsqrt(mean(x**2) + eps), the same operations in
        # the same order (bit-identical), dispatched as one call instead of five from Python.
        return self.weight * F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (RoFormer), with the rope scaling a config names (llama3, linear, yarn...).

    Angles are computed in fp32 whatever the model dtype, as transformers does, so that logits match.
    """

    def __init__(self, config, head_dim: int):
        super().__init__()
        params = _rope_parameters(config)
        rope_type = params.get("rope_type", "default")
        if rope_type == "default":
            inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
            self.attention_scaling = 1.0
        else:
            inv_freq, self.attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions ``[num_tokens]`` int64 -> cos, sin ``[num_tokens, 1, head_dim]`` in ``dtype``."""
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.attention_scaling).to(dtype)
        sin = (emb.sin() * self.attention_scaling).to(dtype)
        return cos[:, None, :], sin[:, None, :]


def _rope_parameters(config) -> dict:
    params = getattr(config, "rope_parameters", None)
    if params:
        return dict(params)
    params = dict(getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_type", params.pop("type", "default"))
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE: x ``[num_tokens, heads, head_dim]``, cos/sin ``[num_tokens, 1, head_dim]`` -> x rotated, same shape."""
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    """Grouped-query self-attention over the paged KV cache (num_heads query heads share num_kv_heads K/V heads)."""

    def __init__(self, config, head_dim: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        bias = config.model_type == "qwen2" or getattr(config, "attention_bias", False)
        hidden = config.hidden_size
        self.q_proj = Linear(hidden, self.num_heads * head_dim, bias=bias)
        self.k_proj = Linear(hidden, self.num_kv_heads * head_dim, bias=bias)
        self.v_proj = Linear(hidden, self.num_kv_heads * head_dim, bias=bias)
        self.o_proj = Linear(self.num_heads * head_dim, hidden, bias=getattr(config, "attention_bias", False))
        if config.model_type == "qwen3":
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps)
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
        p = meta.num_prefill_tokens
        if not 0 <= p <= n or n == 0:
            raise ValueError(f"a batch of {n} query tokens with {p} prefill tokens: the scheduler gave the model nothing to compute")
        parts = []  # the prefill tokens' attention, then the decode tokens'
        # An fp8 prompt attends to its K and V as the pool holds them (quantized), as vLLM's paged kernels do:
        # never to this step's unquantized projections.
        if p > 0 and meta.prefills_from_scratch and meta.backend.prefill_varlen is not None and not scales:
            parts.append(meta.backend.prefill_varlen(q[:p], k[:p], v[:p], meta.prefill_query_start_loc, self.scale))
        elif p > 0:
            parts.append(meta.backend.prefill(
                q[:p], key_cache, value_cache, meta.prefill_block_tables,
                meta.prefill_context_lens, meta.prefill_query_start_loc, self.scale, **scales,
            ))
        if p < n:
            parts.append(meta.backend.decode(
                q[p:], key_cache, value_cache, meta.decode_block_tables, meta.decode_context_lens, self.scale, **plan, **scales
            ))
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return self.o_proj(out.view(n, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config):
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, bias=bias)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=bias)

    cpu_kernel: bool = False  # silu(gate) * up through engine.cpu.ops.silu_and_mul, see CausalLM.use_cpu_kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.cpu_kernel and not torch.is_grad_enabled():
            return self.down_proj(cpu_ops.silu_and_mul(gate, up))
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """One transformer block. Takes and returns ``(hidden, residual)`` (vLLM's layout): the block's input is
    ``hidden + residual`` (``residual`` None: ``hidden`` alone, in the first layer), and so is its output.
    Each residual add happens inside the RMSNorm that follows it, see :class:`RMSNorm`.
    """

    def __init__(self, config, head_dim: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, head_dim)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    decode_weights: tuple | None = None  # (weights, biases, sizes, scale, eps) for engine.cpu.ops.decode_layer, see CausalLM.use_cpu_kernels

    def forward(self, hidden, residual, cos, sin, kv_cache, meta):
        if residual is None:
            residual, hidden = hidden, self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, cos, sin, kv_cache, meta)
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
        self.layers = nn.ModuleList(DecoderLayer(config, head_dim) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class CausalLM(nn.Module):
    """A decoder-only language model whose attention goes through the engine's paged KV cache.

    Args:
        config: a transformers ``LlamaConfig`` / ``Qwen2Config`` / ``Qwen3Config``.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = config.num_key_value_heads
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.model = Backbone(config, self.head_dim)
        self.rotary_emb = RotaryEmbedding(config, self.head_dim)
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
        cos, sin = self.rotary_emb(positions, hidden.dtype)
        residual = None
        # The one-call C++ decode layers write and read pools of the model's dtype: an fp8 pool goes layer by layer.
        one_call = (self.decode_layers and meta.backend.cpu_decode_layer and meta.num_prefill_tokens == 0
                    and not kv_quant.is_fp8(kv_caches[0][0].dtype)
                    and hidden.shape[0] > 0 and not torch.is_grad_enabled() and not self._watched())
        if one_call and self.layers_decode_weights is not None:  # all layers and the final norm in one C++ call
            weights, biases, sizes, scale, eps = self.layers_decode_weights
            norm = self.model.norm
            return cpu_ops.decode_layers(hidden, cos, sin, kv_caches, meta.slot_mapping, meta.decode_block_tables, meta.decode_context_lens,
                                         weights, biases, sizes, scale, eps, norm.weight, norm.eps)
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            hidden, residual = (layer.decode if one_call else layer)(hidden, residual, cos, sin, kv_cache, meta)
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
        """hidden ``[n, hidden_size]`` -> logits ``[n, vocab_size]`` in fp32."""
        weight = self.model.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight
        if self.cpu_kernels and hidden.shape[0] > 0 and not torch.is_grad_enabled():
            return cpu_ops.small_batch_linear(hidden, weight, self.lm_head_packed).float()
        if self.lm_head_t is not None:
            return (hidden @ self.lm_head_t).float()
        return F.linear(hidden, weight).float()

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
        weights; only where the kernel was built with AVX-512, see :func:`engine.cpu.ops.supports`), the
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
            elif isinstance(module, (RMSNorm, Attention)):
                module.cpu_kernel = self.model.norm.weight.dtype in (torch.float32, torch.bfloat16)
            elif isinstance(module, MLP):
                module.cpu_kernel = module.gate_proj.weight.dtype in (torch.float32, torch.bfloat16)
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
        self.decode_layers = all(m.cpu_kernel for layer in layers for m in layer.modules() if isinstance(m, (Linear, RMSNorm, Attention, MLP)))
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
    if getattr(config, "use_sliding_window", False):
        raise WeightLoadError("sliding-window attention is not supported")
    with torch.device("meta"):
        model = CausalLM(config)
    state_dict = dict(state_dict)
    if model.tie_word_embeddings:
        state_dict.pop("lm_head.weight", None)  # some checkpoints store the tied copy too
    _check_tensors(model, state_dict)
    state_dict = {name: t.to(device=device, dtype=dtype) for name, t in state_dict.items()}
    model.load_state_dict(state_dict, strict=True, assign=True)
    model.rotary_emb = RotaryEmbedding(config, model.head_dim).to(device)
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
