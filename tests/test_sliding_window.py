"""Sliding-window attention in every attention path: the torch reference, the Triton decode and prefill
kernels and the engine's C++ decode kernel.

The window's meaning is Hugging Face's (``kv_idx > q_idx - sliding_window``): a query at position p sees
keys p - W + 1 .. p. Each case's caches are built so that skipping is visible: the block-table entries of
blocks wholly before a sequence's window point at a garbage block, all NaN (for the kernels: a read of it
leaks NaN through the weighted sum of V even where its weight is 0), or for the torch reference outside
the pool (its gather would raise); and the slots of the window's edge block before the window hold NaN.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import paged_kernels
from engine.cpu import ops as cpu_ops
from engine.model_executor.attention import paged_attention_reference, paged_prefill_reference, prefill_varlen_reference
from paged_cases import DEVICE, TOL, make_paged_kv, packed_query

OUTSIDE_THE_POOL = 2**30  # a block id no pool has


def hide_before_window(key_cache, value_cache, block_tables, first_visible, block_size, garbage=None):
    """Blocks wholly before each sequence's first visible position: their table entries point at block
    ``garbage`` (None: outside the pool). Slots of the edge block before it: NaN. Returns the altered
    (cloned) caches and table."""
    if garbage is None:
        garbage = OUTSIDE_THE_POOL
    key_cache, value_cache = key_cache.clone(), value_cache.clone()
    wide = block_tables.clone()
    for s, first in enumerate(first_visible):
        first_block = first // block_size
        for p in range(first_block * block_size, first):
            b = int(wide[s, p // block_size])
            key_cache[b, p % block_size] = float("nan")
            value_cache[b, p % block_size] = float("nan")
        wide[s, :first_block] = garbage
    return key_cache, value_cache, wide


def nan_block(key_cache) -> int:
    """A block of the pool that holds only NaN (make_paged_kv leaves its spare blocks so)."""
    return int(torch.isnan(key_cache.flatten(1)).all(1).nonzero()[0])


def dense_window_attention(q_row, key_cache, value_cache, table, q_pos, window, block_size, group):
    """One query row [num_heads, head_dim] at q_pos over keys q_pos - window + 1 .. q_pos, read slot by slot."""
    positions = range(max(0, q_pos - window + 1), q_pos + 1)
    keys = torch.stack([key_cache[int(table[p // block_size]), p % block_size] for p in positions]).double()  # [T, Hkv, D]
    values = torch.stack([value_cache[int(table[p // block_size]), p % block_size] for p in positions]).double()
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)  # [T, H, D]
    logits = torch.einsum("hd,thd->ht", q_row.double(), keys) * q_row.shape[-1] ** -0.5
    return torch.einsum("ht,thd->hd", logits.softmax(-1), values)


# Windows that end inside a block and on its edge; contexts shorter than, equal to and longer than the window.
DECODE_CASES = [  # block_size, window, ctx_lens, group, num_kv_heads, head_dim
    (16, 37, [0, 10, 37, 38, 100, 161], 2, 2, 64),
    (5, 12, [3, 12, 13, 29, 60], 4, 1, 128),  # Gemma 3's 4 query heads to 1 KV head
    (16, 32, [32, 33, 64, 65], 3, 2, 64),
]


def decode_case(block_size, window, ctx_lens, group, num_kv_heads, head_dim, dtype=torch.float32, outside_the_pool=False):
    kc, vc, bt, cl = make_paged_kv(ctx_lens, block_size, num_kv_heads, head_dim, dtype, device="cpu")
    firsts = [max(0, c - window) for c in ctx_lens]
    kc, vc, bt = hide_before_window(kc, vc, bt, firsts, block_size, None if outside_the_pool else nan_block(kc))
    q = packed_query(len(ctx_lens), group * num_kv_heads, num_kv_heads, head_dim, dtype, device="cpu")
    return q, kc, vc, bt, cl


@pytest.mark.parametrize("block_size,window,ctx_lens,group,num_kv_heads,head_dim", DECODE_CASES)
def test_reference_decode_sees_the_window_only(block_size, window, ctx_lens, group, num_kv_heads, head_dim):
    q, kc, vc, bt, cl = decode_case(block_size, window, ctx_lens, group, num_kv_heads, head_dim, outside_the_pool=True)
    out = paged_attention_reference(q, kc, vc, bt, cl, head_dim**-0.5, sliding_window=window)
    assert not torch.isnan(out).any()
    for s, c in enumerate(ctx_lens):
        if c == 0:
            assert torch.all(out[s] == 0)
            continue
        expected = dense_window_attention(q[s], kc, vc, bt[s], c - 1, window, block_size, group)
        torch.testing.assert_close(out[s].double(), expected, atol=1e-5, rtol=1e-5)


def test_a_window_longer_than_every_context_is_full_attention():
    q, kc, vc, bt, cl = decode_case(16, 4096, [5, 40, 100], 2, 2, 64, outside_the_pool=True)
    full = paged_attention_reference(q, kc, vc, bt, cl, 0.125)
    torch.testing.assert_close(paged_attention_reference(q, kc, vc, bt, cl, 0.125, sliding_window=4096), full, atol=0, rtol=0)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("block_size,window,ctx_lens,group,num_kv_heads,head_dim", DECODE_CASES)
def test_triton_decode_matches_the_reference(block_size, window, ctx_lens, group, num_kv_heads, head_dim, num_splits):
    """Split-K too: a partition wholly before the window contributes nothing."""
    q, kc, vc, bt, cl = decode_case(block_size, window, ctx_lens, group, num_kv_heads, head_dim)
    ref = paged_attention_reference(q, kc, vc, bt, cl, head_dim**-0.5, sliding_window=window)
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    out = paged_kernels.paged_attention_decode(dev(q), dev(kc), dev(vc), dev(bt), dev(cl), head_dim**-0.5,
                                               num_splits=num_splits, sliding_window=window)
    assert not torch.isnan(out).any(), "a slot before the window was read"
    torch.testing.assert_close(out.cpu(), ref, **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size,window,ctx_lens,group,num_kv_heads,head_dim", DECODE_CASES)
def test_cpu_kernel_decode_matches_the_reference(block_size, window, ctx_lens, group, num_kv_heads, head_dim, dtype):
    if not cpu_ops.load_kernel():
        pytest.skip("the engine's CPU kernels did not build here")
    q, kc, vc, bt, cl = decode_case(block_size, window, ctx_lens, group, num_kv_heads, head_dim, dtype)
    ref = paged_attention_reference(q, kc, vc, bt, cl, head_dim**-0.5, sliding_window=window)
    out = cpu_ops.paged_attention_decode(q, kc, vc, bt, cl, head_dim**-0.5, sliding_window=window)
    assert not torch.isnan(out).any(), "a slot before the window was read"
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


def test_cpu_kernel_checks_only_the_blocks_it_reads():
    """A table entry outside the pool is refused inside the window, and ignored before it."""
    if not cpu_ops.load_kernel():
        pytest.skip("the engine's CPU kernels did not build here")
    q, kc, vc, bt, cl = decode_case(16, 20, [100], 2, 2, 64, outside_the_pool=True)
    cpu_ops.paged_attention_decode(q, kc, vc, bt, cl, 0.125, sliding_window=20)  # entries 0..4 are outside the pool
    with pytest.raises(RuntimeError, match="is not a block of the pool"):
        cpu_ops.paged_attention_decode(q, kc, vc, bt, cl, 0.125, sliding_window=40)


PREFILL_CASES = [  # q_lens, prefix_lens, block_size, window, group, num_kv_heads
    ([40, 7, 1], [0, 50, 90], 16, 24, 2, 2),  # a prompt longer than the window; chunks after long prefixes
    ([33, 20], [17, 3], 5, 9, 4, 1),  # odd blocks, a tiny window
]


@pytest.mark.parametrize("q_lens,prefix_lens,block_size,window,group,num_kv_heads", PREFILL_CASES)
def test_prefill_reference_and_triton_see_the_window_only(q_lens, prefix_lens, block_size, window, group, num_kv_heads):
    head_dim = 64
    ctx_lens = [q + p for q, p in zip(q_lens, prefix_lens)]
    kc, vc, bt, cl = make_paged_kv(ctx_lens, block_size, num_kv_heads, head_dim, torch.float32, device="cpu")
    firsts = [max(0, p - window + 1) for p in prefix_lens]  # the first query's window
    kc, vc, bt = hide_before_window(kc, vc, bt, firsts, block_size, nan_block(kc))
    starts = [0, *itertools.accumulate(q_lens)]
    qsl = torch.tensor(starts, dtype=torch.int32)
    q = packed_query(starts[-1], group * num_kv_heads, num_kv_heads, head_dim, torch.float32, device="cpu")
    outside = bt.masked_fill(bt == nan_block(kc), OUTSIDE_THE_POOL)  # the reference reads the same tables, garbage outside the pool
    ref = paged_prefill_reference(q, kc, vc, outside, cl, qsl, head_dim**-0.5, sliding_window=window)
    for s, (ql, prefix) in enumerate(zip(q_lens, prefix_lens)):
        for i in range(ql):
            expected = dense_window_attention(q[starts[s] + i], kc, vc, bt[s], prefix + i, window, block_size, group)
            torch.testing.assert_close(ref[starts[s] + i].double(), expected, atol=1e-5, rtol=1e-5)
    dev = lambda t: t.to(DEVICE)  # noqa: E731
    out = paged_kernels.paged_attention_prefill(dev(q), dev(kc), dev(vc), dev(bt), dev(cl), dev(qsl), head_dim**-0.5, sliding_window=window)
    assert not torch.isnan(out).any(), "a slot before a window was read"
    torch.testing.assert_close(out.cpu(), ref, **TOL[torch.float32])


def test_prefill_varlen_with_a_window_equals_the_paged_prefill():
    """Prompts with nothing cached: the fast path's window mask gives what the paged reference gives."""
    q_lens, block_size, window, num_kv_heads, head_dim = [40, 9, 25], 16, 12, 1, 64
    kc, vc, bt, cl = make_paged_kv(q_lens, block_size, num_kv_heads, head_dim, torch.float32, device="cpu")
    starts = [0, *itertools.accumulate(q_lens)]
    qsl = torch.tensor(starts, dtype=torch.int32)
    q = packed_query(starts[-1], 4, num_kv_heads, head_dim, torch.float32, device="cpu")
    slots = torch.tensor([int(bt[s, i // block_size]) * block_size + i % block_size for s, n in enumerate(q_lens) for i in range(n)])
    key, value = kc.reshape(-1, num_kv_heads, head_dim)[slots], vc.reshape(-1, num_kv_heads, head_dim)[slots]
    out = prefill_varlen_reference(q, key, value, qsl, head_dim**-0.5, sliding_window=window)
    ref = paged_prefill_reference(q, kc, vc, bt, cl, qsl, head_dim**-0.5, sliding_window=window)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    full = prefill_varlen_reference(q, key, value, qsl, head_dim**-0.5)
    assert not torch.allclose(out[window:q_lens[0]], full[window:q_lens[0]], atol=1e-3), "rows past the window must differ from full attention"
    torch.testing.assert_close(out[:window], full[:window], atol=1e-6, rtol=1e-6)  # rows inside the first window: the same
