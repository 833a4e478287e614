"""Prefill attention over a paged KV cache: a prompt's new tokens, causally, plus cached context.

Algorithm (PagedAttention paper §4.1 for the paging, FlashAttention for the tiling; vLLM runs
the same computation as its "context attention" / prefix-prefill kernel).

Sequence ``s`` owns query rows ``query_start_loc[s] : query_start_loc[s+1]`` (``q_len`` tokens)
and has ``context_lens[s]`` tokens in the cache after this step, its new K/V included. The new
tokens are the last ``q_len`` positions, so query row ``i`` sits at position
``context_len - q_len + i`` and may attend to every token at a position ``<=`` its own: the
cached prefix (a shared system prompt, or earlier chunks of a chunked prefill) and the new
tokens before it.

One program handles one (tile of ``BLOCK_Q`` query tokens, sequence, KV head). As in the decode
kernel it loads the query rows of all ``group`` query heads of that KV head together, here
flattened into ``BLOCK_Q * GROUP_PAD`` rows of a single ``tl.dot`` operand (row ``r`` is token
``r // GROUP_PAD``, head ``r % GROUP_PAD`` of the group), so every K/V tile loaded serves all of
them. It then walks keys ``TILE_K`` at a time up to the position of its last query token
(later tokens are masked by causality anyway), gathering a block id per token through the block
table, and accumulates an online softmax in fp32 (see ``paged_attention_decode.py``). fp8 caches are
dequantized tile by tile in registers, ``fp8 * k_scale`` (``v_scale``), as in the decode kernel.

With a sliding window of W tokens (``sliding_window``), query position p sees positions p - W + 1 .. p:
the walk starts at the first key the tile's first query sees, so blocks wholly before every row's window
are never read, and keys of the walked tiles before a row's window are masked for that row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from paged_kernels._common import FP8_DTYPES, check_attention_inputs, check_scales, dot_precision, interpreted, next_pow2

LOG2E = 1.4426950408889634


@triton.jit
def _paged_attention_prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr, query_start_loc_ptr, out_ptr,
    scale_log2,  # softmax scale * log2(e): we use exp2
    sliding_window,  # 0: full attention; W: each query sees its last W positions only
    k_scale, v_scale,  # fp8 caches: K and V are read as fp8 * scale
    stride_qt, stride_qh, stride_qd,  # query [num_tokens, num_heads, head_dim]
    stride_kb, stride_ko, stride_kh, stride_kd,  # key_cache [block, offset, kv_head, dim]
    stride_vb, stride_vo, stride_vh, stride_vd,
    stride_bts, stride_btb,  # block_tables [num_seqs, max_blocks]
    stride_ot, stride_oh, stride_od,  # out [num_tokens, num_heads, head_dim]
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,  # power of two >= GROUP
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,  # power of two >= max(16, head_dim)
    BLOCK_SIZE: tl.constexpr,
    BLOCK_Q: tl.constexpr,  # query tokens per program (power of two >= 16)
    TILE_K: tl.constexpr,  # key tokens per loop iteration (power of two >= 16)
    PRECISION: tl.constexpr,
    FP8: tl.constexpr,  # the caches hold fp8: dequantize each tile in registers
):
    # Index math in int64: block_id * stride can pass 2**31 (and the interpreter checks every
    # int32 add/mul for overflow, which is slow).
    q_tile = tl.program_id(0).to(tl.int64)
    seq = tl.program_id(1).to(tl.int64)
    kv_head = tl.program_id(2).to(tl.int64)

    q_begin = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int64) - q_begin
    if q_tile * BLOCK_Q >= q_len:
        return  # this sequence is shorter than the longest one: nothing to do
    context_len = tl.load(context_lens_ptr + seq).to(tl.int64)
    prefix = context_len - q_len  # tokens that were already cached before this step

    r = tl.arange(0, BLOCK_Q * GROUP_PAD).to(tl.int64)
    qi = q_tile * BLOCK_Q + r // GROUP_PAD  # query token index within the sequence
    g = r % GROUP_PAD
    head = kv_head * GROUP + g
    row_ok = (qi < q_len) & (g < GROUP)
    d = tl.arange(0, HEAD_DIM_PAD).to(tl.int64)
    d_ok = d < HEAD_DIM
    q_pos = prefix + qi  # absolute position of each query row

    row_t = q_begin + qi
    q = tl.load(
        q_ptr + row_t[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=row_ok[:, None] & d_ok[None, :], other=0.0,
    )  # [BLOCK_Q * GROUP_PAD, HEAD_DIM_PAD]

    m = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_DIM_PAD], tl.float32)

    # Keys past the last query row's position are masked for every row: stop there.
    kv_end = tl.minimum(context_len, prefix + (q_tile + 1) * BLOCK_Q)
    bt_row = block_tables_ptr + seq * stride_bts
    offs = tl.arange(0, TILE_K).to(tl.int64)
    kv_start = tl.where(sliding_window > 0, tl.maximum(prefix + q_tile * BLOCK_Q - sliding_window + 1, 0), 0)
    for tile_start in range(kv_start, kv_end, TILE_K):
        tok = tile_start + offs
        tok_ok = tok < kv_end
        block_id = tl.load(bt_row + (tok // BLOCK_SIZE) * stride_btb, mask=tok_ok, other=0).to(tl.int64)
        slot_k = block_id * stride_kb + (tok % BLOCK_SIZE) * stride_ko + kv_head * stride_kh
        slot_v = block_id * stride_vb + (tok % BLOCK_SIZE) * stride_vo + kv_head * stride_vh
        kv_mask = tok_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + slot_k[:, None] + d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        if FP8:
            k = (k.to(tl.float32) * k_scale).to(q.dtype)

        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2  # [rows, TILE_K]
        causal = tok_ok[None, :] & (tok[None, :] <= q_pos[:, None])
        causal &= (sliding_window == 0) | (tok[None, :] > q_pos[:, None] - sliding_window)
        s = tl.where(causal, s, float("-inf"))

        # A row whose window begins after this tile sees only -inf here: m_safe keeps exp2(-inf - -inf)
        # = NaN out (alpha = 1, p = 0 for it). Without a window every row sees the first tile's token.
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + slot_v[:, None] + d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        if FP8:
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new

    out = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(
        out_ptr + row_t[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :],
    )


def paged_attention_prefill(
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
    """Causal prefill attention through block tables; same result as ``engine.model_executor.attention.paged_prefill_reference``.

    The new tokens' K and V must already be in the cache (:func:`paged_kernels.reshape_and_cache`).

    Args:
        query: ``[num_tokens, num_heads, head_dim]`` fp32/fp16/bf16, any strides; sequences packed
            back to back.
        key_cache, value_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``, same dtype, or fp8
            read as ``fp8 * k_scale`` / ``fp8 * v_scale``.
        block_tables: ``[num_seqs, max_blocks]`` int32.
        context_lens: ``[num_seqs]`` int32 tokens in the cache per sequence *after* this step
            (cached prefix + new tokens); must be >= that sequence's query length.
        query_start_loc: ``[num_seqs + 1]`` int32 cumulative query lengths, starting at 0.
        scale: softmax scale.
        sliding_window: None or 0 for full attention; W: query position p sees p - W + 1 .. p, and blocks
            wholly before the window of a tile's first query are not read.
        k_scale, v_scale: fp8 caches only: the layer's per-tensor scales.

    Returns:
        ``[num_tokens, num_heads, head_dim]`` in ``query.dtype``; rows not owned by any sequence are 0.

    Raises:
        ValueError: on mismatched shapes, dtypes or devices, a decreasing ``query_start_loc``, a
            context shorter than its query, or CPU tensors outside interpreter mode.

    Note: reads ``query_start_loc`` and ``context_lens`` on the host (one device sync) to size the grid.
    """
    num_heads, head_dim, block_size, num_kv_heads, num_seqs = check_attention_inputs(
        query, key_cache, value_cache, block_tables, context_lens
    )
    if query_start_loc.dim() != 1 or query_start_loc.dtype != torch.int32 or query_start_loc.shape[0] != num_seqs + 1:
        raise ValueError(
            f"query_start_loc must be 1-D int32 with {num_seqs + 1} entries, got {query_start_loc.dtype} "
            f"shape {tuple(query_start_loc.shape)}"
        )
    if query_start_loc.device != query.device:
        raise ValueError(f"query_start_loc is on {query_start_loc.device}, expected {query.device}")
    check_scales(key_cache, k_scale, v_scale)
    out = torch.zeros_like(query, memory_format=torch.contiguous_format)
    if num_seqs == 0:
        return out
    starts = query_start_loc.cpu()
    q_lens = starts[1:] - starts[:-1]
    if int(starts[0]) != 0 or bool((q_lens < 0).any()) or int(starts[-1]) > query.shape[0]:
        raise ValueError(f"query_start_loc must start at 0, be non-decreasing and end <= {query.shape[0]}")
    if bool((context_lens.cpu() < q_lens).any()):
        raise ValueError("every context_lens[s] must be >= its query length (new tokens are part of the context)")
    max_q_len = int(q_lens.max())
    if max_q_len == 0:
        return out

    group = num_heads // num_kv_heads
    group_pad = next_pow2(group)
    if interpreted():
        # Few, large programs: the interpreter pays per program and per loop iteration.
        block_q = min(max(16, next_pow2(max_q_len)), max(16, 1024 // group_pad))
        tile_k = min(max(16, next_pow2(block_tables.shape[1] * block_size)), 512)
    else:
        block_q = max(16, 64 // group_pad)
        tile_k = 64 if head_dim <= 128 else 32
    grid = (triton.cdiv(max_q_len, block_q), num_seqs, num_kv_heads)
    _paged_attention_prefill_kernel[grid](
        query, key_cache, value_cache, block_tables, context_lens, query_start_loc, out,
        float(scale) * LOG2E, int(sliding_window or 0), float(k_scale), float(v_scale),
        *query.stride(), *key_cache.stride(), *value_cache.stride(),
        block_tables.stride(0), block_tables.stride(1),
        *out.stride(),
        GROUP=group, GROUP_PAD=group_pad,
        HEAD_DIM=head_dim, HEAD_DIM_PAD=max(16, next_pow2(head_dim)),
        BLOCK_SIZE=block_size, BLOCK_Q=block_q, TILE_K=tile_k,
        PRECISION=dot_precision(query.dtype), FP8=key_cache.dtype in FP8_DTYPES,
    )
    return out
