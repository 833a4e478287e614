"""Lab triton_decode: A Triton paged-attention decode kernel / Triton 分页注意力解码内核.

Inside the engine's Triton kernel: gather one block id per token of a tile through the block table,
and the online-softmax update (running max, rescaled sum and accumulator). Runs in Triton's
interpreter on a CPU.

在引擎的 Triton 内核里：按块表为一个段中的每个 token 取出块号，以及在线 softmax 的更新（当前最大值、重新缩放的和与累加器）。在 CPU 上由 Triton 解释器运行。

Your part plugs into the engine in place of its own, in paged_kernels/paged_attention_decode.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade triton_decode --impl labs/mine

Cut by `python -m lessons labs build` from paged_kernels/paged_attention_decode.py; work on a copy.

The module paged_kernels/paged_attention_decode.py, for context:

Decode attention over a paged KV cache: one new query token per sequence.

Algorithm (PagedAttention paper §4.1; vLLM ``paged_attention_v1`` / ``_v2``; FlashDecoding).

A sequence's keys and values are scattered over fixed-size blocks of a shared pool; its block
table lists them in order. Token ``t`` lives in block ``block_table[t // block_size]`` at offset
``t % block_size``. On a GPU one Triton *program* handles one (sequence, KV head) pair and one
split of its context. (Under the CPU interpreter, where each program costs a fixed Python
overhead per operation, one program handles many pairs at once, stacked as the leading dim of
3-D tensors and ``tl.dot`` batches; the math per pair is the same.) Per pair:

1. It loads the query rows of *all* query heads that share this KV head (grouped-query
   attention: ``group = num_heads // num_kv_heads``). Loading K and V once for the whole group,
   instead of once per query head, divides the memory traffic by ``group``. The group is padded
   to at least 16 rows (the smallest ``tl.dot`` tile the GPU compiler accepts) and the padding
   rows are masked when storing.
2. It walks its range of context tokens ``TILE`` tokens at a time. For every token of the tile
   it gathers the block id from the block table, so one tile can span several blocks and block
   sizes that are not powers of two (48) or tiny (1) work the same way. K and V are read with
   ``block_id * stride`` computed in int64 (a large pool overflows int32).
3. Online softmax (Milakov & Gimelshein 2018; FlashAttention): it keeps, per query row, the
   running max ``m`` of the logits, the running sum ``l`` of ``exp(logit - m)`` and the running
   weighted sum ``acc`` of V, all in fp32. When a tile raises the max, the old ``l`` and ``acc``
   are rescaled by ``exp(m_old - m_new)``. So the full row of logits never has to exist at once,
   and large logits (1e4) never overflow because every exponent is <= 0.
   We use ``exp2`` with the scale pre-multiplied by ``log2(e)``: the same math, one
   multiplication less per element on the GPU.

Split-K (vLLM v2, FlashDecoding). With few sequences and long contexts, one program per
(sequence, KV head) leaves most GPU cores idle. Then the context is cut into ``num_splits``
partitions, each program handles one partition and writes its partial output ``acc / l``
together with its ``m`` and ``l``; :mod:`paged_kernels.paged_attention_reduce` then combines them.
A partition that starts past the context (more partitions than blocks) writes
``m = -inf, l = 0`` and contributes nothing.

fp8 caches (vLLM's ``kv_cache_dtype="fp8"``; engine/model_executor/kv_quant.py): each tile of K and V is
loaded as bytes and widened in registers, ``fp8 * k_scale`` (``v_scale``), to the query's dtype before
its ``tl.dot``: memory traffic is a quarter of fp32's, the arithmetic unchanged (vLLM's Triton
attention dequantizes the same way).

Padding rows (``context_lens == 0``) run no loop iteration and write zeros; cache slots outside
a context are never loaded (masked loads), so NaN garbage there cannot leak into the result.

Sliding window (``sliding_window`` W > 0; Mistral, Gemma 3, vLLM's ``sliding_window``): the query at
position ``context_len - 1`` sees the last W positions only. The loop starts at the first tile that
holds one of them, so blocks wholly before the window are never loaded, not even their block-table
entries; the positions of the first tile before the window are masked like those past the context.
"""

from __future__ import annotations
import functools
import math
import torch
import triton
import triton.language as tl
from paged_kernels._common import FP8_DTYPES, check_attention_inputs, check_scales, dot_precision, interpreted, next_pow2
from paged_kernels.paged_attention_reduce import paged_attention_reduce

LAB = "triton_decode"  # the lab whose parts this file holds


@triton.jit
def _paged_attention_decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, max_logits_ptr, exp_sums_ptr,
    scale_log2,  # softmax scale * log2(e)
    sliding_window,  # 0: full attention; W: the last W positions only
    k_scale, v_scale,  # fp8 caches: K and V are read as fp8 * scale
    num_pairs,  # num_seqs * num_kv_heads
    stride_qs, stride_qh, stride_qd,  # query [num_seqs, num_heads, head_dim]
    stride_kb, stride_ko, stride_kh, stride_kd,  # key_cache [block, offset, kv_head, dim]
    stride_vb, stride_vo, stride_vh, stride_vd,  # value_cache
    stride_bts, stride_btb,  # block_tables [num_seqs, max_blocks]
    stride_os, stride_oh, stride_op, stride_od,  # out: [S, H, D] (stride_op = 0) or partials [S, H, P, D]
    stride_ms, stride_mh,  # max_logits / exp_sums [S, H, P] (split mode only; partition stride 1)
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # query heads per KV head
    GROUP_PAD: tl.constexpr,  # GROUP padded to a power of two >= 16 (tl.dot minimum)
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,  # head_dim padded to a power of two >= 16
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block
    TILE: tl.constexpr,  # context tokens per loop iteration (power of two >= 16)
    PARTITION: tl.constexpr,  # context tokens per split (multiple of TILE)
    PAIRS: tl.constexpr,  # (sequence, KV head) pairs per program: 1 on GPU, many in the interpreter
    SPLIT: tl.constexpr,  # True: write partials + (max, sum) for the reduce kernel
    PRECISION: tl.constexpr,  # tl.dot input precision ("ieee" for fp32)
    FP8: tl.constexpr,  # the caches hold fp8: dequantize each tile in registers
):
    # All index math is int64: block_id * stride can pass 2**31 in a large pool (and the
    # interpreter checks every int32 add/mul for overflow, which is slow).
    split = tl.program_id(1)
    pair = tl.program_id(0).to(tl.int64) * PAIRS + tl.arange(0, PAIRS).to(tl.int64)  # [PAIRS]
    pair_ok = pair < num_pairs
    seq = pair // NUM_KV_HEADS
    kv_head = pair % NUM_KV_HEADS

    context_len = tl.load(context_lens_ptr + seq, mask=pair_ok, other=0).to(tl.int64)
    start = split * PARTITION
    end = tl.minimum(context_len, start + PARTITION)  # [PAIRS] this partition's last token + 1
    first = tl.where(sliding_window > 0, tl.maximum(context_len - sliding_window, 0), 0)  # [PAIRS] first visible token
    loop_start = tl.maximum(start, tl.min(tl.where(pair_ok, first, start + PARTITION), axis=0))  # skips tiles before every window

    g = tl.arange(0, GROUP_PAD).to(tl.int64)
    d = tl.arange(0, HEAD_DIM_PAD).to(tl.int64)
    head = kv_head[:, None] * GROUP + g[None, :]  # [PAIRS, GROUP_PAD] query heads of each KV head
    row_ok = pair_ok[:, None] & (g < GROUP)[None, :]
    d_ok = d < HEAD_DIM
    q_mask = row_ok[:, :, None] & d_ok[None, None, :]
    q = tl.load(
        q_ptr + seq[:, None, None] * stride_qs + head[:, :, None] * stride_qh + d[None, None, :] * stride_qd,
        mask=q_mask, other=0.0,
    )  # [PAIRS, GROUP_PAD, HEAD_DIM_PAD]; padding rows/columns are 0

    m = tl.full([PAIRS, GROUP_PAD], float("-inf"), tl.float32)  # running max of logits (log2 units)
    l = tl.zeros([PAIRS, GROUP_PAD], tl.float32)  # running sum of exp2(logit - m)
    acc = tl.zeros([PAIRS, GROUP_PAD, HEAD_DIM_PAD], tl.float32)  # running sum of exp2(logit - m) * v

    bt_row = block_tables_ptr + seq * stride_bts  # [PAIRS] pointers to each pair's block table
    k_head = k_cache_ptr + kv_head * stride_kh
    v_head = v_cache_ptr + kv_head * stride_vh
    offs = tl.arange(0, TILE).to(tl.int64)
    for tile_start in range(loop_start, tl.max(end, axis=0), TILE):
        tok = tile_start + offs  # [TILE] token positions
        tok_ok = (tok[None, :] < end[:, None]) & (tok[None, :] >= first[:, None])  # [PAIRS, TILE]
        # Gather one block id per token: a tile may cover several blocks (or part of one).
        # TODO(triton_decode): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab triton_decode: _paged_attention_decode_kernel")
        kv_mask = tok_ok[:, :, None] & d_ok[None, None, :]
        k_offs = (block_id * stride_kb + in_block * stride_ko)[:, :, None] + d[None, None, :] * stride_kd
        k = tl.load(k_head[:, None, None] + k_offs, mask=kv_mask, other=0.0)  # [PAIRS, TILE, HEAD_DIM_PAD]
        if FP8:
            k = (k.to(tl.float32) * k_scale).to(q.dtype)

        # Logits for every (query head of the group, token of the tile), fp32 accumulate.
        s = tl.dot(q, tl.trans(k, 0, 2, 1), input_precision=PRECISION) * scale_log2  # [PAIRS, GROUP_PAD, TILE]
        s = tl.where(tok_ok[:, None, :], s, float("-inf"))

        # Online softmax. A pair whose context ended before this tile sees only -inf: m_safe
        # keeps exp2(-inf - -inf) = NaN out (alpha = 1 or 0, p = 0 for such rows).
        # TODO(triton_decode): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab triton_decode: _paged_attention_decode_kernel")

        v_offs = (block_id * stride_vb + in_block * stride_vo)[:, :, None] + d[None, None, :] * stride_vd
        v = tl.load(v_head[:, None, None] + v_offs, mask=kv_mask, other=0.0)
        if FP8:
            v = (v.to(tl.float32) * v_scale).to(q.dtype)
        # TODO(triton_decode): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab triton_decode: _paged_attention_decode_kernel")

    # Empty context or empty partition: l == 0, write zeros instead of 0/0.
    out = acc / tl.where(l > 0, l, 1.0)[:, :, None]
    out_offs = (seq * stride_os + split * stride_op)[:, None, None] + head[:, :, None] * stride_oh \
        + d[None, None, :] * stride_od
    tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    if SPLIT:
        ml_offs = seq[:, None] * stride_ms + head * stride_mh + split
        tl.store(max_logits_ptr + ml_offs, m, mask=row_ok)
        tl.store(exp_sums_ptr + ml_offs, l, mask=row_ok)
