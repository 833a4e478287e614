"""Triton kernels against the torch oracle in engine.model_executor.attention.

Without a GPU these run under Triton's interpreter (``import paged_kernels`` sets TRITON_INTERPRET=1
when no CUDA device exists), so the matrix is a covering set, not a cross product: every listed
block size, GQA group, head_dim, dtype and context edge appears at least once.

Every case is built to catch addressing bugs: block tables are random permutations (never the
identity), passed as views into a wider tensor whose extra columns point at NaN blocks, and
every cache slot outside the live contexts holds NaN, so a kernel that reads past a context or
past its table produces NaN.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import paged_kernels
from engine.model_executor.attention import (paged_attention_reference, paged_prefill_reference, plan_step, prefill_varlen_reference,
                                             write_kv_cache)
from paged_cases import DEVICE, TOL, assert_decode_output, make_paged_kv, packed_query

NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 and >2**31-element pools need a CUDA GPU")


def check_decode(ctx_lens, block_size, group, num_kv_heads, head_dim, dtype, num_splits=None, q_scale=1.0,
                 k_scale=1.0, tol=None):
    num_heads = group * num_kv_heads
    kc, vc, bt, cl = make_paged_kv(ctx_lens, block_size, num_kv_heads, head_dim, dtype, value_scale=k_scale)
    q = packed_query(len(ctx_lens), num_heads, num_kv_heads, head_dim, dtype, scale=q_scale)
    scale = head_dim ** -0.5
    out = paged_kernels.paged_attention_decode(q, kc, vc, bt, cl, scale, num_splits=num_splits)
    ref = paged_attention_reference(q, kc, vc, bt, cl, scale)
    assert_decode_output(out, ref, q, ctx_lens, tol)
    return out


def test_torch_step_plan_changes_nothing():
    """The engine's per-step plan (block tables translated to slots once, shared by every layer) gives
    exactly what the reference computes on its own, including the empty context and NaN-filled slots."""
    ctx_lens = [1, 15, 16, 17, 0, 47]
    kc, vc, bt, cl = make_paged_kv(ctx_lens, 16, 3, 64, torch.float32)
    q = packed_query(len(ctx_lens), 9, 3, 64, torch.float32)
    slots = torch.tensor([3, 17, 40, 41, 5, 60], device=DEVICE)
    plan = plan_step(slots, bt, cl, 16)
    assert plan.all_slots_valid and plan.decode.any_empty
    with_plan = paged_attention_reference(q, kc, vc, bt, cl, 0.125, plan=plan)
    assert torch.equal(with_plan, paged_attention_reference(q, kc, vc, bt, cl, 0.125))
    assert not torch.isnan(with_plan).any()
    k, v = torch.randn(6, 3, 64, device=DEVICE), torch.randn(6, 3, 64, device=DEVICE)
    kc2, vc2 = kc.clone(), vc.clone()
    write_kv_cache(k, v, kc, vc, slots, plan=plan)  # the unmasked copy
    write_kv_cache(k, v, kc2, vc2, slots)  # the masked one
    assert torch.equal(kc.nan_to_num(7.0), kc2.nan_to_num(7.0)) and torch.equal(vc.nan_to_num(7.0), vc2.nan_to_num(7.0))
    assert not plan_step(torch.tensor([3, -1], device=DEVICE), bt[:0], cl[:0], 16).all_slots_valid


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU fallback")
def test_interpreter_is_enabled_without_cuda():
    assert paged_kernels.interpreted()


# (block_size, group, num_kv_heads, head_dim, dtype, context lengths). Together these cover
# block sizes 1/8/16/48/128, groups 1/2/3/5/8, head_dim 64/80/128, fp32/fp16, and contexts
# 0, 1, bs-1, bs, bs+1, k*bs-1, k*bs+1.
DECODE_CASES = [
    (16, 3, 3, 64, torch.float32, [1, 15, 16, 17, 0, 47, 49]),  # the default model's shape
    (1, 1, 2, 64, torch.float32, [1, 2, 0, 9]),
    (8, 2, 2, 80, torch.float32, [7, 8, 9, 23, 25, 1]),
    (48, 5, 1, 128, torch.float32, [47, 48, 49, 95, 97, 0]),
    (128, 8, 1, 64, torch.float32, [127, 128, 129, 1]),
    (16, 3, 2, 80, torch.float16, [1, 15, 16, 17, 0, 33]),
    (48, 8, 1, 128, torch.float16, [1, 47, 49, 97]),
    (8, 5, 1, 64, torch.float16, [7, 9, 17]),
]


@pytest.mark.parametrize("block_size,group,num_kv_heads,head_dim,dtype,ctx_lens", DECODE_CASES)
def test_decode_matches_reference(block_size, group, num_kv_heads, head_dim, dtype, ctx_lens):
    check_decode(ctx_lens, block_size, group, num_kv_heads, head_dim, dtype, num_splits=1)


@pytest.mark.parametrize(
    "block_size,group,head_dim,dtype,ctx_lens,num_splits",
    [
        (16, 3, 64, torch.float32, [1, 0, 17, 100], 3),
        (8, 2, 80, torch.float32, [9, 23, 0], 2),
        (16, 3, 64, torch.float32, [20, 5], 8),  # more partitions than the context has blocks: empty ones
        (48, 5, 128, torch.float16, [49, 0, 97], 4),
        (1, 1, 64, torch.float32, [1, 3], 7),
    ],
)
def test_decode_split_k_matches_reference(block_size, group, head_dim, dtype, ctx_lens, num_splits):
    check_decode(ctx_lens, block_size, group, 2, head_dim, dtype, num_splits=num_splits)


def test_decode_split_k_equals_single_pass():
    args = ([33, 70, 5], 16, 3, 3, 64, torch.float32)
    single = check_decode(*args, num_splits=1)
    split = check_decode(*args, num_splits=5)
    torch.testing.assert_close(split, single, atol=1e-6, rtol=1e-6)


def test_decode_one_pair_per_program(monkeypatch):
    """The GPU launch layout (one (sequence, KV head) per program), run under the interpreter too."""
    import importlib

    # importlib: the attribute paged_kernels.paged_attention_decode is the function, not the module.
    mod = importlib.import_module("paged_kernels.paged_attention_decode")

    monkeypatch.setattr(mod, "INTERPRETER_PAIRS", 1)
    check_decode([1, 16, 0, 33], 16, 3, 3, 64, torch.float32)
    check_decode([1, 16, 0, 33], 16, 3, 3, 64, torch.float32, num_splits=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_decode_large_logits_do_not_overflow(dtype):
    # |q|, |k| ~ 30 elementwise -> logits ~ 1e4 after scaling; exp of them would overflow fp32.
    q_scale, k_scale = 30.0, 30.0
    kc, vc, bt, cl = make_paged_kv([40, 17], 16, 1, 64, dtype, value_scale=k_scale)
    q = packed_query(2, 3, 1, 64, dtype, scale=q_scale)
    logits = torch.einsum("hd,d->h", q[0].float(), kc[bt[0, 0].long(), 0, 0].float()) * 64 ** -0.5
    assert logits.abs().max() > 1e3
    out = paged_kernels.paged_attention_decode(q, kc, vc, bt, cl, 64 ** -0.5)
    ref = paged_attention_reference(q, kc, vc, bt, cl, 64 ** -0.5)
    assert torch.isfinite(out).all()
    # Logits this large carry ~1e-3 absolute rounding error in fp32, so the weights differ slightly.
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


@NEEDS_CUDA
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_bf16(num_splits):
    check_decode([1, 16, 17, 0, 300], 16, 3, 3, 64, torch.bfloat16, num_splits=num_splits)


@NEEDS_CUDA
def test_decode_block_offsets_overflow_int32():
    # block_id * stride(0) > 2**31: the kernel must compute cache offsets in int64.
    block_size, num_kv_heads, head_dim = 16, 1, 128
    stride = block_size * num_kv_heads * head_dim
    num_blocks = (2**31) // stride + 64
    kc = torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=torch.float16, device="cuda")
    vc = torch.zeros_like(kc)
    ids = torch.tensor([[num_blocks - 1, num_blocks - 5, 3]], dtype=torch.int32, device="cuda")
    assert int(ids.max()) * stride > 2**31
    for b in ids[0].tolist():
        kc[b].normal_()
        vc[b].normal_()
    cl = torch.tensor([40], dtype=torch.int32, device="cuda")
    q = torch.randn(1, 4, head_dim, dtype=torch.float16, device="cuda")
    for splits in (1, 2):
        out = paged_kernels.paged_attention_decode(q, kc, vc, ids, cl, head_dim ** -0.5, num_splits=splits)
        ref = paged_attention_reference(q, kc, vc, ids, cl, head_dim ** -0.5)
        torch.testing.assert_close(out, ref, **TOL[torch.float16])
    k = torch.randn(1, num_kv_heads, head_dim, dtype=torch.float16, device="cuda")
    slot = torch.tensor([(num_blocks - 1) * block_size + 7], dtype=torch.int64, device="cuda")
    paged_kernels.reshape_and_cache(k, k, kc, vc, slot)
    assert torch.equal(kc[num_blocks - 1, 7], k[0])


# ---------------------------------------------------------------- reshape_and_cache


@pytest.mark.parametrize(
    "dtype,block_size,num_kv_heads,head_dim", [(torch.float32, 16, 3, 64), (torch.float16, 48, 2, 80)]
)
def test_reshape_and_cache_matches_reference_and_skips_padding(dtype, block_size, num_kv_heads, head_dim):
    gen = torch.Generator().manual_seed(3)
    num_blocks, num_tokens = 6, 11
    sentinel = torch.full((num_blocks, block_size, num_kv_heads, head_dim), 7.0, dtype=dtype)
    kc, vc = sentinel.clone().to(DEVICE), sentinel.clone().to(DEVICE)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    # K and V as slices of a packed projection (non-contiguous).
    packed = torch.randn(num_tokens, 3 * num_kv_heads * head_dim, generator=gen).to(dtype).to(DEVICE)
    key = packed[:, num_kv_heads * head_dim : 2 * num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    value = packed[:, 2 * num_kv_heads * head_dim :].view(num_tokens, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[1, 4, 10]] = -1
    slots = slots.to(DEVICE)
    paged_kernels.reshape_and_cache(key, value, kc, vc, slots)
    write_kv_cache(key, value, kc_ref, vc_ref, slots)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
    written = (kc != 7.0).any(dim=(2, 3)).sum().item()
    assert written == num_tokens - 3


def test_reshape_and_cache_all_padding_writes_nothing():
    kc = torch.full((4, 8, 2, 64), float("nan")).to(DEVICE)
    vc = kc.clone()
    key = torch.randn(5, 2, 64).to(DEVICE)
    slots = torch.full((5,), -1, dtype=torch.int64).to(DEVICE)
    paged_kernels.reshape_and_cache(key, key, kc, vc, slots)
    assert torch.isnan(kc).all() and torch.isnan(vc).all()


# ---------------------------------------------------------------- prefill


def check_prefill(q_lens, prefix_lens, block_size, group, num_kv_heads, head_dim, dtype, write_with_kernel=False):
    ctx_lens = [q + p for q, p in zip(q_lens, prefix_lens)]
    num_heads = group * num_kv_heads
    kc, vc, bt, cl = make_paged_kv(ctx_lens, block_size, num_kv_heads, head_dim, dtype)
    starts = [0, *itertools.accumulate(q_lens)]
    qsl = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    q = packed_query(starts[-1], num_heads, num_kv_heads, head_dim, dtype)
    if write_with_kernel:
        # Overwrite the new tokens' K/V with the kernel, as the engine does before attention.
        gen = torch.Generator().manual_seed(9)
        key = torch.randn(starts[-1], num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
        value = torch.randn(starts[-1], num_kv_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
        slots = []
        for s, (ql, p) in enumerate(zip(q_lens, prefix_lens)):
            for pos in range(p, p + ql):
                slots.append(int(bt[s, pos // block_size]) * block_size + pos % block_size)
        paged_kernels.reshape_and_cache(key, value, kc, vc, torch.tensor(slots, dtype=torch.int64, device=DEVICE))
    scale = head_dim ** -0.5
    out = paged_kernels.paged_attention_prefill(q, kc, vc, bt, cl, qsl, scale)
    ref = paged_prefill_reference(q, kc, vc, bt, cl, qsl, scale)
    assert out.shape == q.shape and out.dtype == dtype
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), ref.float(), **TOL[dtype])


@pytest.mark.parametrize(
    "q_lens,prefix_lens,block_size,group,num_kv_heads,head_dim,dtype",
    [
        ([5, 17, 1, 16], [0, 0, 0, 0], 16, 3, 3, 64, torch.float32),  # plain prompts
        ([5, 17, 1, 3], [11, 16, 40, 0], 16, 3, 3, 64, torch.float32),  # cached prefixes / chunks
        ([9, 4, 0, 2], [7, 0, 3, 1], 8, 2, 2, 80, torch.float16),  # an empty query in the batch
        ([30, 2], [49, 47], 48, 5, 1, 128, torch.float32),
        ([3, 4], [1, 0], 1, 1, 2, 64, torch.float32),
        ([20, 7], [108, 0], 128, 8, 1, 64, torch.float16),
    ],
)
def test_prefill_matches_reference(q_lens, prefix_lens, block_size, group, num_kv_heads, head_dim, dtype):
    check_prefill(q_lens, prefix_lens, block_size, group, num_kv_heads, head_dim, dtype)


def test_prefill_after_reshape_and_cache():
    check_prefill([6, 13], [10, 0], 16, 3, 3, 64, torch.float32, write_with_kernel=True)


@pytest.mark.parametrize("q_lens,group,num_kv_heads,dtype", [
    ([5, 17, 1, 16], 3, 3, torch.float32),  # SmolLM2's grouping, prompts of unequal lengths
    ([32, 32, 32], 3, 3, torch.float32),  # equal lengths: no padding
    ([9, 0, 4], 2, 2, torch.float16),  # an empty query in the batch
    ([30], 5, 1, torch.float64),
    ([7, 3], 1, 4, torch.float32),  # no grouping
])
def test_prefill_varlen_equals_the_paged_prefill(q_lens, group, num_kv_heads, dtype):
    """A prompt with nothing cached before it: attention over the step's own K and V (the fast path) gives
    what reading them back through the block table gives, row by row, with the same shape and dtype."""
    block_size, head_dim = 16, 64
    kc, vc, bt, cl = make_paged_kv(q_lens, block_size, num_kv_heads, head_dim, dtype)
    starts = [0, *itertools.accumulate(q_lens)]
    qsl = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    q = packed_query(starts[-1], group * num_kv_heads, num_kv_heads, head_dim, dtype)
    slots = torch.tensor([int(bt[s, i // block_size]) * block_size + i % block_size for s, n in enumerate(q_lens) for i in range(n)],
                         dtype=torch.int64, device=DEVICE)
    flat = lambda cache: cache.reshape(-1, num_kv_heads, head_dim)  # noqa: E731
    key, value = flat(kc)[slots], flat(vc)[slots]  # the K and V the step computed, as the cache holds them
    out = prefill_varlen_reference(q, key, value, qsl, head_dim ** -0.5)
    ref = paged_prefill_reference(q, kc, vc, bt, cl, qsl, head_dim ** -0.5)
    assert out.shape == q.shape and out.dtype == dtype and not torch.isnan(out).any()
    torch.testing.assert_close(out.float(), ref.float(), **TOL.get(dtype, dict(atol=1e-12, rtol=1e-12)))
    if q_lens[0]:  # causal: a prompt's first token sees only itself, so each query head returns its KV head's value
        torch.testing.assert_close(out[0].float(), value[0].repeat_interleave(group, 0).float(), **TOL.get(dtype, {}))


@NEEDS_CUDA
def test_prefill_bf16():
    check_prefill([5, 70], [16, 33], 16, 3, 3, 64, torch.bfloat16)


def test_prefill_last_token_equals_decode():
    """The last prompt token's prefill output is exactly what a decode step at that position computes."""
    kc, vc, bt, cl = make_paged_kv([21, 40], 16, 3, 64, torch.float32)
    q = packed_query(8, 9, 3, 64, torch.float32)
    qsl = torch.tensor([0, 5, 8], dtype=torch.int32, device=DEVICE)
    pre = paged_kernels.paged_attention_prefill(q, kc, vc, bt, cl, qsl, 0.125)
    dec = paged_kernels.paged_attention_decode(q[[4, 7]], kc, vc, bt, cl, 0.125)
    torch.testing.assert_close(pre[[4, 7]], dec, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- validation


def test_invalid_inputs_raise_value_error():
    kc, vc, bt, cl = make_paged_kv([5, 9], 8, 2, 64, torch.float32)
    q = torch.randn(2, 4, 64).to(DEVICE)
    with pytest.raises(ValueError, match="head_dim"):
        paged_kernels.paged_attention_decode(q[..., :32], kc, vc, bt, cl, 0.1)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_kernels.paged_attention_decode(torch.randn(2, 3, 64).to(DEVICE), kc, vc, bt, cl, 0.1)
    with pytest.raises(ValueError, match="block_tables"):
        paged_kernels.paged_attention_decode(q, kc, vc, bt.long(), cl, 0.1)
    with pytest.raises(ValueError, match="context_lens"):
        paged_kernels.paged_attention_decode(q, kc, vc, bt, cl[:1], 0.1)
    with pytest.raises(ValueError, match="dtype"):
        paged_kernels.paged_attention_decode(q.half(), kc, vc, bt, cl, 0.1)
    with pytest.raises(ValueError, match="num_splits"):
        paged_kernels.paged_attention_decode(q, kc, vc, bt, cl, 0.1, num_splits=0)
    with pytest.raises(ValueError, match="value_cache"):
        paged_kernels.paged_attention_decode(q, kc, vc[:, :4], bt, cl, 0.1)
    with pytest.raises(ValueError, match="slot_mapping"):
        paged_kernels.reshape_and_cache(q[:, :2], q[:, :2], kc, vc, torch.zeros(2, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="query_start_loc"):
        paged_kernels.paged_attention_prefill(q, kc, vc, bt, cl, torch.tensor([0, 1], dtype=torch.int32, device=DEVICE), 0.1)
    with pytest.raises(ValueError, match="context_lens"):
        qsl = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEVICE)
        paged_kernels.paged_attention_prefill(q, kc, vc, bt, torch.zeros_like(cl), qsl, 0.1)
