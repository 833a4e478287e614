"""Copy whole KV blocks inside the paged pools, in every layer (vLLM's ``copy_blocks``).

Algorithm. This is the copy half of copy-on-write (PagedAttention paper §4.4). After a fork, two
sequences share a partly filled last block; the first one to write into it is given a fresh block
``dst`` and the scheduler asks for the contents of the shared block ``src`` to be copied there
before the forward pass (vLLM's ``blocks_to_copy``). A block is ``block_size * num_kv_heads *
head_dim`` values in each of K and V, in every layer. Each program takes a tile of ``(src, dst)``
pairs times a tile of one block's values, flattened as ``(offset, head, dim)``, unflattens that
index to address the pools with any strides (views of a wider pool work), and copies K and V from
block ``src`` to block ``dst``. One launch per layer: Triton cannot index a list of tensors, and
the layers' pools need not be views of one tensor.

Order. The programs of a launch run in no fixed order, so a block that is both copied from and
copied to could be read before or after it is overwritten. Copy-on-write never asks for that (a
``dst`` is a block just taken from the free list, so it is nobody's ``src``, and no two copies
share a ``dst``); the wrapper checks it, so every source is read as it was before the call.

Addresses are computed in int64: in a large pool ``block_id * stride`` passes 2**31.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from paged_kernels._common import check_caches, check_device, interpreted, next_pow2


@triton.jit
def _copy_blocks_kernel(
    key_cache_ptr, value_cache_ptr, mapping_ptr,
    num_pairs,
    stride_mp, stride_mc,  # block_mapping [num_pairs, 2]
    stride_kcb, stride_kco, stride_kch, stride_kcd,  # key_cache [block, offset, head, dim]
    stride_vcb, stride_vco, stride_vch, stride_vcd,  # value_cache
    HEAD_DIM: tl.constexpr,
    ROW: tl.constexpr,  # num_kv_heads * head_dim: the values of one token (one slot)
    BLOCK_NUMEL: tl.constexpr,  # block_size * ROW: the values of one block
    PAIRS: tl.constexpr,  # (src, dst) pairs handled by one program
    TILE: tl.constexpr,  # values of a block handled by one program (a power of two)
):
    pair = tl.program_id(0) * PAIRS + tl.arange(0, PAIRS)
    pair_ok = pair < num_pairs
    row = pair.to(tl.int64) * stride_mp
    src = tl.load(mapping_ptr + row, mask=pair_ok, other=0).to(tl.int64)
    dst = tl.load(mapping_ptr + row + stride_mc, mask=pair_ok, other=0).to(tl.int64)

    j = tl.program_id(1).to(tl.int64) * TILE + tl.arange(0, TILE).to(tl.int64)
    offset = j // ROW
    head = (j % ROW) // HEAD_DIM
    dim = j % HEAD_DIM
    mask = pair_ok[:, None] & (j < BLOCK_NUMEL)[None, :]

    k_in = (offset * stride_kco + head * stride_kch + dim * stride_kcd)[None, :]
    v_in = (offset * stride_vco + head * stride_vch + dim * stride_vcd)[None, :]
    k = tl.load(key_cache_ptr + src[:, None] * stride_kcb + k_in, mask=mask)
    v = tl.load(value_cache_ptr + src[:, None] * stride_vcb + v_in, mask=mask)
    tl.store(key_cache_ptr + dst[:, None] * stride_kcb + k_in, k, mask=mask)
    tl.store(value_cache_ptr + dst[:, None] * stride_vcb + v_in, v, mask=mask)


def _check_block_mapping(block_mapping: torch.Tensor, num_blocks: int | None) -> list[tuple[int, int]]:
    """Return the pairs as Python ints after checking shape, dtype, range and the copy-on-write order rule."""
    if block_mapping.dim() != 2 or block_mapping.shape[1] != 2 or block_mapping.dtype != torch.int64:
        raise ValueError(
            f"block_mapping must be [num_pairs, 2] int64 (src, dst) block ids, got {block_mapping.dtype} "
            f"shape {tuple(block_mapping.shape)}"
        )
    pairs = [tuple(p) for p in block_mapping.tolist()]  # one small device-to-host copy per call
    if num_blocks is None:
        return pairs
    bad = [p for p in pairs if not (0 <= p[0] < num_blocks and 0 <= p[1] < num_blocks)]
    if bad:
        raise ValueError(f"block_mapping pair {bad[0]} is out of range: block ids must be in [0, {num_blocks})")
    dsts = [d for _, d in pairs]
    if len(set(dsts)) != len(dsts):
        raise ValueError(f"block_mapping copies twice into one dst block: dst ids {dsts} are not distinct")
    both = set(dsts) & {s for s, _ in pairs}
    if both:
        raise ValueError(f"block_mapping uses block {min(both)} as both a dst and a src; a dst must be a fresh block")
    return pairs


def _check_layers(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor]) -> tuple[int, int, int, int] | None:
    """Return the common ``(num_blocks, block_size, num_kv_heads, head_dim)``, or None for no layers."""
    if len(key_caches) != len(value_caches):
        raise ValueError(f"{len(key_caches)} key caches but {len(value_caches)} value caches (one pair per layer)")
    if not key_caches:
        return None
    first = key_caches[0]
    for layer, (key_cache, value_cache) in enumerate(zip(key_caches, value_caches)):
        if check_caches(key_cache, value_cache) != tuple(first.shape) or key_cache.dtype != first.dtype:
            raise ValueError(
                f"layer {layer} cache is {key_cache.dtype} {tuple(key_cache.shape)} but layer 0 is "
                f"{first.dtype} {tuple(first.shape)}; every layer must have the same shape and dtype"
            )
        check_device(f"key_caches[{layer}]", key_cache, first.device)
    return tuple(first.shape)  # type: ignore[return-value]


def copy_blocks(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Copy K and V of block ``src`` into block ``dst`` for every pair, in every layer, in place.

    Same result as ``engine.model_executor.attention.copy_blocks_reference``. The copy half of copy-on-write
    (PagedAttention paper §4.4; vLLM ``copy_blocks`` with the scheduler's ``blocks_to_copy``).

    Args:
        key_caches, value_caches: one pool per layer, each ``[num_blocks, block_size, num_kv_heads,
            head_dim]``, all the same shape, dtype (fp32, fp16, bf16, or fp8: copied as they are, scale unchanged) and device; any strides.
        block_mapping: ``[num_pairs, 2]`` int64 ``(src, dst)`` physical block ids, on the caches'
            device. Every dst is distinct and no dst is a src of the same call (as copy-on-write
            guarantees), so every source is read before it could be overwritten. Empty: nothing is done.

    Raises:
        ValueError: on mismatched shapes, dtypes or devices, CPU tensors outside interpreter mode,
            block ids outside ``[0, num_blocks)``, a repeated dst, or a dst that is also a src.
    """
    shape = _check_layers(key_caches, value_caches)
    if shape is not None:
        check_device("block_mapping", block_mapping, key_caches[0].device)
    num_blocks, block_size, num_kv_heads, head_dim = shape or (None, 0, 0, 0)
    pairs = _check_block_mapping(block_mapping, num_blocks)
    if shape is None or not pairs:
        return
    num_pairs = len(pairs)
    row = num_kv_heads * head_dim
    block_numel = block_size * row
    # A GPU program should hold a few thousand elements; the interpreter pays per program, so it
    # takes whole blocks and as many pairs as fit in about 2**20 values.
    if interpreted():
        tile = next_pow2(block_numel)
        pairs_per_program = min(next_pow2(num_pairs), max(1, 2**20 // tile))
    else:
        tile, pairs_per_program = min(next_pow2(block_numel), 4096), 1
    grid = (triton.cdiv(num_pairs, pairs_per_program), triton.cdiv(block_numel, tile))
    for key_cache, value_cache in zip(key_caches, value_caches):
        _copy_blocks_kernel[grid](
            key_cache, value_cache, block_mapping,
            num_pairs,
            *block_mapping.stride(), *key_cache.stride(), *value_cache.stride(),
            HEAD_DIM=head_dim, ROW=row, BLOCK_NUMEL=block_numel, PAIRS=pairs_per_program, TILE=tile,
        )
