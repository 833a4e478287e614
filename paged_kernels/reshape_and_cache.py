"""Write a step's new keys and values into the paged KV pools (vLLM's ``reshape_and_cache``).

Algorithm. The cache of one layer is two pools ``[num_blocks, block_size, num_kv_heads,
head_dim]``. The scheduler has already decided where every new token goes and encoded it as a
*slot* ``block_id * block_size + offset`` (PagedAttention paper §4.2; vLLM ``slot_mapping``).
Each program takes a tile of tokens, splits every slot back into ``(block_id, offset)`` and
copies the token's ``num_kv_heads * head_dim`` values of K and of V to that address. Slot
``-1`` marks a padding token (e.g. a batch padded to a CUDA-graph size) and is masked out, so
nothing is written for it.

Addresses are computed in int64: in a large pool ``block_id * stride`` passes 2**31.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from paged_kernels._common import check_caches, check_device, interpreted, next_pow2


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr,
    num_tokens,
    stride_kt, stride_kh, stride_kd,  # key [num_tokens, num_kv_heads, head_dim]
    stride_vt, stride_vh, stride_vd,  # value
    stride_kcb, stride_kco, stride_kch, stride_kcd,  # key_cache [block, offset, head, dim]
    stride_vcb, stride_vco, stride_vch, stride_vcd,  # value_cache
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    HEAD_DIM: tl.constexpr,
    ROW: tl.constexpr,  # num_kv_heads * head_dim: the values one token contributes
    ROW_PAD: tl.constexpr,  # ROW rounded up to a power of two (Triton block shapes must be)
    TOKENS: tl.constexpr,  # tokens handled by one program
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
    tl.store(key_cache_ptr + k_dst, k, mask=mask)
    tl.store(value_cache_ptr + v_dst, v, mask=mask)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Copy new K and V into the paged pools, in place. Same result as ``engine.model_executor.attention.write_kv_cache``.

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]``, same dtype as the caches (fp32, fp16,
            bf16); any strides (e.g. slices of a packed QKV projection).
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, written in place.
        slot_mapping: ``[num_tokens]`` int64 slots ``block_id * block_size + offset``; ``-1`` = padding,
            skipped. Slots must be distinct and ``< num_blocks * block_size`` (not checked on device).

    Raises:
        ValueError: on mismatched shapes, dtypes or devices, or CPU tensors outside interpreter mode.
    """
    num_blocks, block_size, num_kv_heads, head_dim = check_caches(key_cache, value_cache)
    for name, t in (("key", key), ("value", value)):
        if t.dim() != 3 or tuple(t.shape[1:]) != (num_kv_heads, head_dim):
            raise ValueError(
                f"{name} must be [num_tokens, {num_kv_heads}, {head_dim}] to match the cache, got {tuple(t.shape)}"
            )
        if t.dtype != key_cache.dtype:
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
        num_tokens,
        *key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(),
        BLOCK_SIZE=block_size, HEAD_DIM=head_dim, ROW=row, ROW_PAD=row_pad, TOKENS=tokens,
    )
