"""Second pass of split-K decode attention: merge per-partition results (vLLM v2 / FlashDecoding).

Algorithm. Partition ``i`` of a (sequence, head) saw logits ``x_j`` for its tokens and produced
``m_i = max_j x_j``, ``l_i = sum_j 2^(x_j - m_i)`` and the normalized partial output
``o_i = sum_j 2^(x_j - m_i) v_j / l_i`` (logits in log2 units, see the decode kernel). With the
global max ``M = max_i m_i``, the exact softmax over all tokens is::

    w_i = l_i * 2^(m_i - M)            # partition i's share of the softmax denominator
    out = sum_i w_i * o_i / sum_i w_i

Empty partitions (``m_i = -inf, l_i = 0``) get ``w_i = 0``. If every partition is empty
(a padded row, ``context_len == 0``), ``M = -inf``; we replace it by 0 so ``2^(m_i - M)`` is
``2^-inf = 0`` rather than ``2^(-inf + inf) = NaN``, and write zeros.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from paged_kernels._common import interpreted, next_pow2


@triton.jit
def _paged_attention_reduce_kernel(
    partial_ptr, max_logits_ptr, exp_sums_ptr, out_ptr,
    num_heads,
    stride_ps, stride_ph, stride_pp, stride_pd,  # partial [S, H, P, D] fp32
    stride_ms, stride_mh,  # max_logits / exp_sums [S, H, P] fp32, partition stride 1
    stride_os, stride_oh, stride_od,  # out [S, H, D]
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,  # NUM_SPLITS rounded up to a power of two
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    HEADS: tl.constexpr,  # heads per program: 1 on GPU, all of them in the interpreter
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64) * HEADS + tl.arange(0, HEADS).to(tl.int64)  # [HEADS]
    p = tl.arange(0, SPLITS_PAD).to(tl.int64)
    d = tl.arange(0, HEAD_DIM_PAD).to(tl.int64)
    h_ok = head < num_heads
    hp_ok = h_ok[:, None] & (p < NUM_SPLITS)[None, :]  # [HEADS, SPLITS_PAD]

    ml_offs = seq * stride_ms + head[:, None] * stride_mh + p[None, :]
    m = tl.load(max_logits_ptr + ml_offs, mask=hp_ok, other=float("-inf"))
    l = tl.load(exp_sums_ptr + ml_offs, mask=hp_ok, other=0.0)
    m_max = tl.max(m, axis=1)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)  # all partitions empty: avoid -inf - -inf
    w = l * tl.exp2(m - m_max[:, None])  # [HEADS, SPLITS_PAD]
    total = tl.sum(w, axis=1)

    o = tl.load(
        partial_ptr + seq * stride_ps + head[:, None, None] * stride_ph + p[None, :, None] * stride_pp
        + d[None, None, :] * stride_pd,
        mask=hp_ok[:, :, None] & (d < HEAD_DIM)[None, None, :], other=0.0,
    )  # [HEADS, SPLITS_PAD, HEAD_DIM_PAD]
    out = tl.sum(w[:, :, None] * o, axis=1) / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(
        out_ptr + seq * stride_os + head[:, None] * stride_oh + d[None, :] * stride_od,
        out.to(out_ptr.dtype.element_ty), mask=h_ok[:, None] & (d < HEAD_DIM)[None, :],
    )


def paged_attention_reduce(
    partial: torch.Tensor, max_logits: torch.Tensor, exp_sums: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """Combine split-K partial results into ``out`` (in place) and return it.

    Args:
        partial: ``[num_seqs, num_heads, num_splits, head_dim]`` fp32, each partition's normalized output.
        max_logits: ``[num_seqs, num_heads, num_splits]`` fp32 contiguous, each partition's max logit
            in log2 units (``-inf`` for an empty partition).
        exp_sums: same shape, each partition's sum of ``2^(logit - max)`` (0 for an empty partition).
        out: ``[num_seqs, num_heads, head_dim]``, any float dtype; written in place.

    Raises:
        ValueError: on shape mismatches or non-contiguous ``max_logits`` / ``exp_sums``.
    """
    num_seqs, num_heads, num_splits, head_dim = partial.shape
    if max_logits.shape != (num_seqs, num_heads, num_splits) or exp_sums.shape != max_logits.shape:
        raise ValueError(
            f"max_logits {tuple(max_logits.shape)} / exp_sums {tuple(exp_sums.shape)} must be "
            f"{(num_seqs, num_heads, num_splits)}"
        )
    if max_logits.stride() != exp_sums.stride() or max_logits.stride(2) != 1:
        raise ValueError("max_logits and exp_sums must be contiguous with identical strides")
    if out.shape != (num_seqs, num_heads, head_dim):
        raise ValueError(f"out shape {tuple(out.shape)} != {(num_seqs, num_heads, head_dim)}")
    if num_seqs == 0 or num_heads == 0:
        return out
    # GPU: one (sequence, head) per program; the interpreter pays per program, so all heads at once.
    heads = next_pow2(num_heads) if interpreted() else 1
    _paged_attention_reduce_kernel[(num_seqs, triton.cdiv(num_heads, heads))](
        partial, max_logits, exp_sums, out, num_heads,
        *partial.stride(), max_logits.stride(0), max_logits.stride(1), *out.stride(),
        NUM_SPLITS=num_splits, SPLITS_PAD=next_pow2(num_splits),
        HEAD_DIM=head_dim, HEAD_DIM_PAD=next_pow2(head_dim), HEADS=heads,
    )
    return out
