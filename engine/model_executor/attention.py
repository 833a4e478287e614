"""PagedAttention in plain torch: the CPU default and the oracle for the Triton kernels.

Cache layout (one pair of pools per transformer layer)::

    key_cache   [num_blocks, block_size, num_kv_heads, head_dim]
    value_cache [num_blocks, block_size, num_kv_heads, head_dim]

Token position ``i`` of a sequence lives in physical block ``block_table[i // block_size]``
at offset ``i % block_size``; its *slot* is ``block_id * block_size + offset``
(PagedAttention paper §4.1-4.2, vLLM's ``slot_mapping``). Every function here but one reads K and V
only through block tables, never from a per-sequence contiguous tensor, so a wrong block
table shows up as a wrong answer. The one, :func:`prefill_varlen_reference`, is the fast path of
a prefill with nothing cached before it: its prompt's K and V are this step's own, so it reads them
as computed (their copy still goes through the slot mapping, and every later step reads it back
through the block table).

Sliding-window attention (Mistral, Gemma 2 and 3; vLLM's ``sliding_window``): with a window of W tokens
a query at position p sees positions p - W + 1 .. p only (Hugging Face's mask ``kv_idx > q_idx - W``).
The block tables are then read from the block holding the first visible position on
(:func:`window_gather_index`): blocks wholly before the window are never read, so a hybrid KV cache may
already have given them back; the few positions of the edge block before the window are masked.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from engine.core.lab_impl import plug_lab_parts
from engine.model_executor import kv_quant


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    plan: TorchStepPlan | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Copy a step's new K and V into the pools, one token per slot (vLLM's ``reshape_and_cache``).

    Args:
        key, value: ``[num_tokens, num_kv_heads, head_dim]``, the caches' dtype (or the model's, for fp8 caches).
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, written in place; an
            fp8 pool (``torch.float8_e4m3fn``/``float8_e5m2``) stores ``fp8(key / k_scale)`` and
            ``fp8(value / v_scale)`` (:func:`engine.model_executor.kv_quant.quantize_kv`).
        slot_mapping: ``[num_tokens]`` int64; slot ``-1`` marks padding and is never written.
        plan: the step's :class:`TorchStepPlan`; when it says every slot is valid (the engine's case),
            the copy skips the padding mask.
        k_scale, v_scale: fp8 pools only: the layer's scales (vLLM's ``k_scale``, ``v_scale``).
    """
    if kv_quant.is_fp8(key_cache.dtype):  # quantized on write, then copied as bytes (torch has no fp8 index_copy_ on CPU)
        key = kv_quant.quantize_kv(key, k_scale, key_cache.dtype).view(torch.uint8)
        value = kv_quant.quantize_kv(value, v_scale, value_cache.dtype).view(torch.uint8)
        key_cache, value_cache = kv_quant.as_bytes(key_cache), kv_quant.as_bytes(value_cache)
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    flat_k = key_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    flat_v = value_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    if plan is not None and plan.all_slots_valid:
        flat_k.index_copy_(0, slot_mapping, key)
        flat_v.index_copy_(0, slot_mapping, value)
        return
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    flat_k[slots] = key[valid]
    flat_v[slots] = value[valid]


def copy_blocks_reference(key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Copy whole KV blocks in every layer, in place (vLLM's ``copy_blocks``): the copy half of
    copy-on-write (PagedAttention paper §4.4). The Triton version is ``paged_kernels.copy_blocks``.

    Args:
        key_caches, value_caches: one pool per layer, ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_mapping: ``[num_pairs, 2]`` int64 ``(src, dst)`` block ids; every dst is distinct and no
            dst is a src of the same call (a copy-on-write's dst is a block just taken from the free list).
    """
    if block_mapping.numel() == 0:
        return
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    for key_cache, value_cache in zip(map(kv_quant.as_bytes, key_caches), map(kv_quant.as_bytes, value_caches)):
        key_cache[dst] = key_cache[src]
        value_cache[dst] = value_cache[src]


def swap_blocks(src_caches: list[torch.Tensor], dst_caches: list[torch.Tensor], block_mapping: torch.Tensor) -> None:
    """Copy whole KV blocks from one pool to another, in every layer (vLLM's ``swap_blocks``):
    swap preemption moves a request's blocks to the CPU swap space and back (PagedAttention paper
    §4.5). The same torch code runs for GPU -> CPU, CPU -> GPU and CPU -> CPU; a pinned CPU pool
    lets the copy to or from a GPU run as one DMA transfer per layer and tensor.

    Args:
        src_caches, dst_caches: the K and V pools of every layer, in the same order, each
            ``[num_blocks, block_size, num_kv_heads, head_dim]`` of one dtype (the two sides' block
            counts may differ).
        block_mapping: ``[num_pairs, 2]`` int64 ``(src_block, dst_block)``, on the CPU; every
            dst_block is distinct.

    Raises:
        ValueError: the pools' layouts differ (block_size, num_kv_heads, head_dim or dtype).
    """
    if block_mapping.numel() == 0:
        return
    src_idx, dst_idx = block_mapping[:, 0], block_mapping[:, 1]
    for src, dst in zip(src_caches, dst_caches, strict=True):
        if src.shape[1:] != dst.shape[1:] or src.dtype != dst.dtype:
            raise ValueError(f"swap_blocks: pools of different layouts, {tuple(src.shape)} {src.dtype} and {tuple(dst.shape)} {dst.dtype}")
        src, dst = kv_quant.as_bytes(src), kv_quant.as_bytes(dst)  # an fp8 block moves as its bytes, scale unchanged
        blocks = src[src_idx.to(src.device)]
        dst[dst_idx.to(dst.device)] = blocks.to(dst.device, non_blocking=dst.device.type == "cuda" or src.device.type == "cuda")
    if any(c.device.type == "cuda" for c in src_caches + dst_caches):
        torch.cuda.synchronize()  # a copy to pinned CPU memory is asynchronous; the step reads it next


@dataclass
class GatherIndex:
    """Where to read each sequence's K/V rows from, computed once per step and shared by every layer.

    Attributes:
        slots: ``[num_seqs * max_blocks * block_size]`` int64, the pool row (slot) of each position,
            sequence-major; positions past a context point at a real slot but are zeroed after the read.
        dead_rows: ``[n]`` int64, the entries of ``slots`` past their sequence's context.
        live: ``[num_seqs, max_blocks * block_size]`` bool, the position is inside the context.
        any_empty: some sequence has ``context_lens == 0`` (its softmax is over nothing).
        start: ``[num_seqs]`` int64, the position of each sequence's first gathered column (a sliding
            window's first block, :func:`window_gather_index`); None: position 0.
    """

    slots: torch.Tensor
    dead_rows: torch.Tensor
    live: torch.Tensor
    any_empty: bool
    start: torch.Tensor | None = None


def gather_index(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int) -> GatherIndex:
    """Translate block tables into per-position slots (``block_table[i // block_size] * block_size + i % block_size``).

    Args:
        block_tables: ``[num_seqs, max_blocks]`` int32.
        context_lens: ``[num_seqs]`` int32, tokens.
        block_size: slots per block.
    """
    # BEGIN SOLUTION paged_attention
    num_seqs, max_blocks = block_tables.shape
    device = block_tables.device
    positions = torch.arange(max_blocks * block_size, device=device)
    blocks = block_tables.long().clamp(min=0)[:, positions // block_size]
    slots = blocks * block_size + positions % block_size  # [S, T]: the slot of each position
    lens = context_lens.to(device).long()
    live = positions[None, :] < lens[:, None]
    dead_rows = torch.nonzero(~live.flatten()).squeeze(1)
    return GatherIndex(slots.flatten(), dead_rows, live, bool((lens == 0).any()) if num_seqs else False)
    # END SOLUTION


def window_gather_index(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int,
                        first_visible: torch.Tensor) -> GatherIndex:
    """:func:`gather_index` for a sliding window: each sequence's columns start at the block that holds its
    first visible position, so the blocks wholly before the window are not read (their table entries may
    hold anything); positions of that edge block before ``first_visible`` are dead, like those past the context.

    Args:
        block_tables: ``[num_seqs, max_blocks]`` int32.
        context_lens: ``[num_seqs]`` int32, tokens.
        block_size: slots per block.
        first_visible: ``[num_seqs]`` int64, the first position any query of the sequence may see
            (decode: ``max(0, context_len - sliding_window)``).

    Returns:
        a :class:`GatherIndex` whose ``start`` is each sequence's first gathered position, a multiple of
        ``block_size``; its width is the most blocks any sequence needs, at most the whole table.
    """
    num_seqs, max_blocks = block_tables.shape
    device = block_tables.device
    lens = context_lens.to(device).long()
    first = first_visible.to(device).long().clamp(min=0)
    start = first // block_size * block_size
    num_cols = int(((lens - start + block_size - 1) // block_size).clamp(min=0).max()) * block_size if num_seqs else 0
    pos = start[:, None] + torch.arange(num_cols, device=device)[None, :]  # [S, T] absolute positions
    live = (pos >= first[:, None]) & (pos < lens[:, None])
    entries = (pos // block_size).clamp(max=max_blocks - 1)
    blocks = block_tables.long().gather(1, entries).clamp(min=0)
    slots = torch.where(live, blocks * block_size + pos % block_size, 0)  # a dead column reads slot 0 (then zeroed): never a table entry's garbage
    dead_rows = torch.nonzero(~live.flatten()).squeeze(1)
    return GatherIndex(slots.flatten(), dead_rows, live, bool((lens == 0).any()) if num_seqs else False, start)


@dataclass
class TorchStepPlan:
    """What the torch backend precomputes once per step (vLLM's attention-metadata builder does the same).

    Attributes:
        all_slots_valid: no ``-1`` in the step's slot_mapping, so writes need no mask.
        decode: the :class:`GatherIndex` of the step's decode sequences (None when there are none).
    """

    all_slots_valid: bool
    decode: GatherIndex | None


def plan_step(slot_mapping: torch.Tensor, decode_block_tables: torch.Tensor, decode_context_lens: torch.Tensor, block_size: int) -> TorchStepPlan:
    """Build the step's :class:`TorchStepPlan` (slot_mapping ``[num_tokens]`` int64; block tables ``[num_decodes, max_blocks]`` int32)."""
    valid = bool((slot_mapping >= 0).all()) if slot_mapping.numel() else True
    decode = gather_index(decode_block_tables, decode_context_lens, block_size) if decode_block_tables.shape[0] else None
    return TorchStepPlan(valid, decode)


def plan_writes(slot_mapping: torch.Tensor, decode_block_tables: torch.Tensor, decode_context_lens: torch.Tensor, block_size: int) -> TorchStepPlan:
    """:func:`plan_step` without the decode gather index, for a decode attention that reads the block
    tables itself (the engine's CPU kernel, :func:`engine.cpu.ops.paged_attention_decode`)."""
    return TorchStepPlan(bool((slot_mapping >= 0).all()) if slot_mapping.numel() else True, None)


def gather_kv(
    cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, index: GatherIndex | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read each sequence's K (or V) through its block table into a padded tensor.

    Args:
        cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: ``[num_seqs, max_blocks]`` int32.
        context_lens: ``[num_seqs]`` int32.
        index: the same tables already translated by :func:`gather_index` (computed here when None).

    Returns:
        (``[num_seqs, max_blocks * block_size, num_kv_heads, head_dim]`` with zeros past each context,
        ``live`` ``[num_seqs, max_blocks * block_size]`` bool: the position is inside the context).
        Positions past a context never carry what the pool holds there (stale K/V, or NaN).
    """
    # BEGIN SOLUTION paged_attention
    num_seqs = block_tables.shape[0]
    num_blocks, block_size, num_kv_heads, head_dim = cache.shape
    if index is None:
        index = gather_index(block_tables, context_lens, block_size)
    rows = cache.reshape(num_blocks * block_size, num_kv_heads * head_dim).index_select(0, index.slots)
    rows.index_fill_(0, index.dead_rows, 0.0)
    return rows.view(num_seqs, -1, num_kv_heads, head_dim), index.live
    # END SOLUTION


def gather_kv_dequantized(
    cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, index: GatherIndex | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gather_kv` for a pool of any dtype: an fp8 pool's blocks are gathered as their bytes, then
    read as ``fp8 * scale`` in fp32 (:func:`engine.model_executor.kv_quant.dequantize_kv`); any other pool
    as :func:`gather_kv` reads it (``scale`` unused)."""
    if not kv_quant.is_fp8(cache.dtype):
        return gather_kv(cache, block_tables, context_lens, index)
    rows, live = gather_kv(kv_quant.as_bytes(cache), block_tables, context_lens, index)
    return kv_quant.dequantize_kv(rows.view(cache.dtype), scale), live


def paged_attention_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    plan: TorchStepPlan | None = None,
    sliding_window: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Decode attention: one query token per sequence against its whole context (or its last
    ``sliding_window`` tokens), through its block table.

    Grouped-query attention: query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)``.
    With one query token, the ``num_heads // num_kv_heads`` query heads of a group are like that many
    queries against the same keys, so each (sequence, KV head) is one small attention problem.
    A sequence with ``context_lens == 0`` (a padded row) gets zeros, and cache slots outside a
    sequence's context are never read into the result, even if they hold NaN.

    Args:
        query: ``[num_seqs, num_heads, head_dim]`` (fp32/fp16/bf16/fp64; may be a strided view).
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: ``[num_seqs, max_blocks]`` int32; entries past a sequence's blocks are ignored.
        context_lens: ``[num_seqs]`` int32, tokens of context per sequence (including the current one).
        scale: softmax scale, usually ``head_dim ** -0.5``.
        plan: the step's :class:`TorchStepPlan` (its gather index is reused by every layer); None: computed here.
        sliding_window: None (or 0) for full attention; W: the query sees its last W positions only, and
            the blocks before them are not read (:func:`window_gather_index`).
        k_scale, v_scale: fp8 pools only: K and V are read as ``fp8 * k_scale`` and ``fp8 * v_scale``.

    Returns:
        ``[num_seqs, num_heads, head_dim]`` in ``query.dtype``.

    Source: PagedAttention paper §4.1 (attention over non-contiguous KV blocks); vLLM's
    ``paged_attention_v1`` computes the same thing.
    """
    if sliding_window:  # the window's gather index in place of the whole context's
        first = context_lens.to(block_tables.device).long() - sliding_window
        plan = TorchStepPlan(True, window_gather_index(block_tables, context_lens, key_cache.shape[1], first))
    # BEGIN SOLUTION paged_attention
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = key_cache.shape[2]
    index = plan.decode if plan is not None and plan.decode is not None else gather_index(block_tables, context_lens, key_cache.shape[1])
    keys, live = gather_kv_dequantized(key_cache, block_tables, context_lens, index, k_scale)  # [S, T, Hkv, D]
    values, _ = gather_kv_dequantized(value_cache, block_tables, context_lens, index, v_scale)
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32  # softmax in fp32 at least
    q = query.reshape(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim).to(compute)
    out = F.scaled_dot_product_attention(
        q, keys.transpose(1, 2).to(compute), values.transpose(1, 2).to(compute),
        attn_mask=live[:, None, None, :], scale=scale,
    )
    if index.any_empty:
        out = out.nan_to_num_(0.0)  # an empty context masks every position: softmax of nothing
    return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)
    # END SOLUTION


def paged_prefill_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Prefill attention: each sequence's new query tokens attend causally to everything in its cache
    (with ``sliding_window`` W, to their last W positions each).

    Sequence ``s`` owns query rows ``query_start_loc[s]:query_start_loc[s+1]`` (``q_len`` tokens);
    they sit at positions ``context_lens[s] - q_len .. context_lens[s] - 1``, so the first
    ``context_lens[s] - q_len`` positions are context already cached (a shared prefix, or an earlier
    chunk). Their K and V must already be written to the cache (see :func:`write_kv_cache`).

    Args:
        query: ``[num_tokens, num_heads, head_dim]``.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        block_tables: ``[num_seqs, max_blocks]`` int32.
        context_lens: ``[num_seqs]`` int32, tokens in the cache per sequence after this step.
        query_start_loc: ``[num_seqs + 1]`` int32, cumulative query lengths (vLLM's name).
        scale: softmax scale.
        sliding_window: None (or 0) for full attention; W: query position p sees p - W + 1 .. p, and
            the blocks before the first query's window are not read.
        k_scale, v_scale: fp8 pools only: K and V are read as ``fp8 * k_scale`` and ``fp8 * v_scale``.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in ``query.dtype``.
    """
    num_tokens, num_heads, head_dim = query.shape
    num_seqs = block_tables.shape[0]
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    if num_tokens == 0 or num_seqs == 0:
        return torch.zeros_like(query)
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32  # softmax in fp32 at least
    device = query.device
    starts = query_start_loc.to(device).long()
    q_lens = starts[1:] - starts[:-1]
    # Every sequence's whole context (with a window: from the first query's window on), read through its
    # block table: [S, T, Hkv, D], zeros past it.
    if sliding_window:
        first = context_lens.to(device).long() - q_lens - sliding_window + 1
        index = window_gather_index(block_tables, context_lens, key_cache.shape[1], first)
    else:
        index = gather_index(block_tables, context_lens, key_cache.shape[1])
    keys, live = gather_kv_dequantized(key_cache, block_tables, context_lens, index, k_scale)
    values, _ = gather_kv_dequantized(value_cache, block_tables, context_lens, index, v_scale)
    # The queries padded per sequence: row j of sequence s is token starts[s] + j.
    j = torch.arange(int(q_lens.max()), device=device)
    q_valid = j[None, :] < q_lens[:, None]  # [S, Qmax]
    rows = (starts[:-1, None] + j[None, :]).clamp(max=num_tokens - 1)
    q = query[rows.flatten()].reshape(num_seqs, -1, num_kv_heads, group, head_dim)  # [S, Qmax, Hkv, G, D]
    q_max = q.shape[1]
    # Causal: query j sits at position context_len - q_len + j and sees positions up to its own.
    q_pos = (context_lens.to(device).long() - q_lens)[:, None] + j[None, :]  # [S, Qmax]
    t = torch.arange(keys.shape[1], device=device)[None, None, :]  # the position of each gathered key
    if index.start is not None:
        t = t + index.start[:, None, None]
    allowed = (t <= q_pos[:, :, None]) & live[:, None, :]  # [S, Qmax, T]
    if sliding_window:
        allowed &= t > q_pos[:, :, None] - sliding_window
    # Grouped-query attention: the G query heads of a KV head become G * Qmax rows against its keys.
    q = q.permute(0, 2, 3, 1, 4).reshape(num_seqs, num_kv_heads, group * q_max, head_dim)
    mask = allowed[:, None, None].expand(num_seqs, 1, group, q_max, keys.shape[1]).reshape(num_seqs, 1, group * q_max, -1)
    out = F.scaled_dot_product_attention(
        q.to(compute), keys.transpose(1, 2).to(compute), values.transpose(1, 2).to(compute), attn_mask=mask, scale=scale
    )  # [S, Hkv, G * Qmax, D]; padded query rows see nothing and are dropped below
    out = out.view(num_seqs, num_kv_heads, group, q_max, head_dim).permute(0, 3, 1, 2, 4).reshape(num_seqs * q_max, num_heads, head_dim)
    return out[q_valid.flatten()].to(query.dtype)


def prefill_varlen_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Prefill attention for prompts with nothing in the cache before them (no prefix-cache hit, no
    earlier chunk): each prompt's tokens attend causally to the prompt's own K and V, taken from this
    step's projections instead of gathered back through the block table.

    The result equals :func:`paged_prefill_reference`'s for such prompts (the same keys and values,
    only read from where they were computed). What it saves is the gather and the explicit mask: the
    prompts are stacked right-padded and attention runs with ``is_causal`` (a padded row sits after every
    real row of its prompt, so no real row sees it), which takes torch's flash-attention path on CPU.
    A 128-token prompt's attention, SmolLM2's 9 query and 3 KV heads: 0.58 -> 0.23 ms a layer; 16 of
    them at once: 8.4 -> 3.6 ms (2 cores). vLLM's torch-SDPA CPU backend runs such prompts the same
    way, as ``flash_attn_varlen_func`` does on GPUs.

    Args:
        query: ``[num_tokens, num_heads, head_dim]``, the prompts one after another.
        key, value: ``[num_tokens, num_kv_heads, head_dim]``, this step's K and V of the same tokens.
        query_start_loc: ``[num_seqs + 1]`` int32, cumulative prompt lengths (vLLM's name).
        scale: softmax scale.
        sliding_window: None (or 0) for full attention; W: row p sees rows p - W + 1 .. p of its prompt
            (an explicit mask, only for prompts longer than W: shorter ones are causal as they are).

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in ``query.dtype`` (computed in fp32 at least).
    """
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    starts = query_start_loc.tolist()
    lens = [b - a for a, b in zip(starts, starts[1:])]
    if num_tokens == 0 or not lens:
        return torch.zeros_like(query)
    num_seqs, longest = len(lens), max(lens)
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32
    if all(n == longest for n in lens):
        keep = None
        pad = lambda x: x.reshape(num_seqs, longest, x.shape[1], head_dim)  # noqa: E731
    else:
        rows, keep = _padding(tuple(starts), str(query.device))
        pad = lambda x: x.index_select(0, rows).view(num_seqs, longest, x.shape[1], head_dim)  # noqa: E731
    q, k, v = (pad(x).transpose(1, 2).to(compute) for x in (query, key, value))  # [S, heads, longest, D]
    if sliding_window and longest > sliding_window:
        i = torch.arange(longest, device=query.device)
        in_window = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - sliding_window)  # [query row, key row]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=in_window, scale=scale, enable_gqa=num_kv_heads != num_heads)
    else:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=num_kv_heads != num_heads)
    out = out.transpose(1, 2).reshape(num_seqs * longest, num_heads, head_dim)
    return (out if keep is None else out.index_select(0, keep)).to(query.dtype)


@functools.lru_cache(maxsize=8)
def _padding(starts: tuple[int, ...], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """For prompts at ``starts`` (cumulative lengths), stacked right-padded to the longest: ``rows``, the
    token each padded row takes (a padded row repeats its prompt's last token: any finite values would do,
    no real row reads them), and ``keep``, the padded rows that are real tokens, in order. Computed once
    per step, not once per layer (every layer of a step passes the same prompts; read-only)."""
    lens = [b - a for a, b in zip(starts, starts[1:])]
    longest, last = max(lens), starts[-1] - 1
    rows = [min(a + min(j, max(n - 1, 0)), last) for a, n in zip(starts, lens) for j in range(longest)]
    keep = [s * longest + j for s, n in enumerate(lens) for j in range(n)]
    return torch.tensor(rows, device=device), torch.tensor(keep, device=device)


plug_lab_parts(globals())  # labs: a student's part in place of the engine's (engine/core/lab_impl.py)
