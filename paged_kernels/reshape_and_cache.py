"""Write a step's new keys and values into the paged KV pools (vLLM's ``reshape_and_cache``).

Algorithm. The cache of one layer is two pools ``[num_blocks, block_size, num_kv_heads,
head_dim]``. The scheduler has already decided where every new token goes and encoded it as a
*slot* ``block_id * block_size + offset`` (PagedAttention paper §4.2; vLLM ``slot_mapping``).
Each program takes a tile of tokens, splits every slot back into ``(block_id, offset)`` and
copies the token's ``num_kv_heads * head_dim`` values of K and of V to that address. Slot
``-1`` marks a padding token (e.g. a batch padded to a CUDA-graph size) and is masked out, so
nothing is written for it.

Addresses are computed in int64: in a large pool ``block_id * stride`` passes 2**31.

An fp8 pool (vLLM's ``kv_cache_dtype="fp8"``; engine/model_executor/kv_quant.py) is quantized on the
way: the program divides K by ``k_scale`` and V by ``v_scale`` in registers, saturates at the format's
largest value and stores one byte per element, rounded to the nearest fp8 value, ties to even (torch's
cast, and CUDA's). The rounding is done in fp32 arithmetic before the cast (:func:`_nearest_fp8`), so
the cast itself is exact: Triton's interpreter casts fp32 to fp8 by truncating the mantissa and adding
the first dropped bit, which rounds ties away from zero, loses the carry when the rounding reaches the
next power of two (31.5 becomes 16 in e4m3) and flushes subnormals to zero; a GPU's cast needs no help.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from paged_kernels._common import FP8_DTYPES, check_caches, check_device, check_scales, interpreted, next_pow2


@triton.jit
def _nearest_fp8(x, MANTISSA: tl.constexpr, MIN_EXP: tl.constexpr, FP8_MAX: tl.constexpr):
    """The fp8 value nearest ``x`` (fp32; ties to even), saturated at +-FP8_MAX, still in fp32: a value the
    cast to fp8 then holds exactly. MANTISSA: the format's mantissa bits; MIN_EXP: its smallest normal
    exponent (below it the step stays that of the subnormals)."""
    x = tl.clamp(x, -FP8_MAX, FP8_MAX)
    exponent = tl.maximum(((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, MIN_EXP)  # floor(log2 |x|)
    step = ((exponent - MANTISSA + 127) << 23).to(tl.float32, bitcast=True)  # 2**(exponent - MANTISSA): fp8's spacing there
    steps = x / step  # exact: a power of two
    steps = (steps + 12582912.0) - 12582912.0  # + 1.5 * 2**23: fp32's own rounding to an integer, ties to even
    return steps * step


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr,
    num_tokens,
    k_scale, v_scale,  # fp8 pools: what K and V are divided by before they are stored
    stride_kt, stride_kh, stride_kd,  # key [num_tokens, num_kv_heads, head_dim]
    stride_vt, stride_vh, stride_vd,  # value
    stride_kcb, stride_kco, stride_kch, stride_kcd,  # key_cache [block, offset, head, dim]
    stride_vcb, stride_vco, stride_vch, stride_vcd,  # value_cache
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    HEAD_DIM: tl.constexpr,
    ROW: tl.constexpr,  # num_kv_heads * head_dim: the values one token contributes
    ROW_PAD: tl.constexpr,  # ROW rounded up to a power of two (Triton block shapes must be)
    TOKENS: tl.constexpr,  # tokens handled by one program
    FP8_MAX: tl.constexpr,  # fp8 pools: the format's largest finite value (saturation); 0.0: not fp8
    FP8_MANTISSA: tl.constexpr,  # fp8 pools: mantissa bits (e4m3: 3, e5m2: 2)
    FP8_MIN_EXP: tl.constexpr,  # fp8 pools: smallest normal exponent (e4m3: -6, e5m2: -14)
):
    tok = tl.program_id(0) * TOKENS + tl.arange(0, TOKENS)
    tok_ok = tok < num_tokens
    slot = tl.load(slot_ptr + tok, mask=tok_ok, other=-1).to(tl.int64)
    write = tok_ok & (slot >= 0)  # -1 = padding token: nothing is written for it
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    # One token's row is flattened as (head, dim); unflatten to index with arbitrary strides.
    j = tl.arange(0, ROW_PAD)
    head = j // HEAD_DIM
    dim = j % HEAD_DIM
    mask = write[:, None] & (j < ROW)[None, :]

    tok64 = tok.to(tl.int64)
    k = tl.load(key_ptr + tok64[:, None] * stride_kt + head[None, :] * stride_kh + dim[None, :] * stride_kd, mask=mask)
    v = tl.load(value_ptr + tok64[:, None] * stride_vt + head[None, :] * stride_vh + dim[None, :] * stride_vd, mask=mask)
    k_dst = block[:, None] * stride_kcb + offset[:, None] * stride_kco + head[None, :] * stride_kch + dim[None, :] * stride_kcd
    v_dst = block[:, None] * stride_vcb + offset[:, None] * stride_vco + head[None, :] * stride_vch + dim[None, :] * stride_vcd
    if FP8_MAX > 0:  # quantize in registers: fp8(x / scale), saturated
        k = _nearest_fp8(k.to(tl.float32) / k_scale, FP8_MANTISSA, FP8_MIN_EXP, FP8_MAX)
        v = _nearest_fp8(v.to(tl.float32) / v_scale, FP8_MANTISSA, FP8_MIN_EXP, FP8_MAX)
    tl.store(key_cache_ptr + k_dst, k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + v_dst, v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Copy new K and V into the paged pools, in place. Same result as ``engine.model_executor.attention.write_kv_cache``.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]``, same dtype as the caches (fp32, fp16,
            bf16; any of them for fp8 caches); any strides (e.g. slices of a packed QKV projection).
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, written in place;
            fp8 (``torch.float8_e4m3fn``/``float8_e5m2``) pools store ``fp8(key / k_scale)``, ``fp8(value / v_scale)``.
        slot_mapping: ``[num_tokens]`` int64 slots ``block_id * block_size + offset``; ``-1`` = padding,
            skipped. Slots must be distinct and ``< num_blocks * block_size`` (not checked on device).
        k_scale, v_scale: fp8 pools only: the layer's per-tensor scales (vLLM's ``k_scale``, ``v_scale``).

    Raises:
        ValueError: on mismatched shapes, dtypes or devices, scales <= 0, or CPU tensors outside interpreter mode.
    """
    num_blocks, block_size, num_kv_heads, head_dim = check_caches(key_cache, value_cache)
    for name, t in (("key", key), ("value", value)):
        if t.dim() != 3 or tuple(t.shape[1:]) != (num_kv_heads, head_dim):
            raise ValueError(
                f"{name} must be [num_tokens, {num_kv_heads}, {head_dim}] to match the cache, got {tuple(t.shape)}"
            )
        if t.dtype != key_cache.dtype and key_cache.dtype not in FP8_DTYPES:
            raise ValueError(f"{name} dtype {t.dtype} != cache dtype {key_cache.dtype}")
        check_device(name, t, key_cache.device)
    if key.shape[0] != value.shape[0]:
        raise ValueError(f"key has {key.shape[0]} tokens but value has {value.shape[0]}")
    if slot_mapping.dim() != 1 or slot_mapping.dtype != torch.int64 or slot_mapping.shape[0] != key.shape[0]:
        raise ValueError(
            f"slot_mapping must be 1-D int64 with {key.shape[0]} entries, got {slot_mapping.dtype} "
            f"shape {tuple(slot_mapping.shape)}"
        )
    check_device("slot_mapping", slot_mapping, key_cache.device)
    check_scales(key_cache, k_scale, v_scale)
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    row = num_kv_heads * head_dim
    row_pad = next_pow2(row)
    # A GPU program should hold a few thousand elements; the interpreter pays per program, so it
    # takes every token at once.
    tokens = min(next_pow2(num_tokens), max(1, 2**20 // row_pad)) if interpreted() else max(1, min(16, 4096 // row_pad))
    grid = (triton.cdiv(num_tokens, tokens),)
    _reshape_and_cache_kernel[grid](
        key, value, key_cache, value_cache, slot_mapping,
        num_tokens, float(k_scale), float(v_scale),
        *key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(),
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, ROW=row, ROW_PAD=row_pad, TOKENS=tokens,
        **_fp8_format(key_cache.dtype),
    )


def _fp8_format(dtype: torch.dtype) -> dict:
    """The kernel's fp8 constants for a pool dtype (FP8_MAX 0.0: not fp8)."""
    if dtype not in FP8_DTYPES:
        return dict(FP8_MAX=0.0, FP8_MANTISSA=0, FP8_MIN_EXP=0)
    info = torch.finfo(dtype)
    return dict(FP8_MAX=info.max, FP8_MANTISSA=3 if dtype == torch.float8_e4m3fn else 2, FP8_MIN_EXP=int(math.log2(info.tiny)))
