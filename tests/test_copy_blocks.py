"""paged_kernels.copy_blocks (the copy half of copy-on-write) against the torch oracle and a block-by-block expectation.

Without a GPU these run under Triton's interpreter (``import paged_kernels`` sets TRITON_INTERPRET=1 when no
CUDA device exists), in fp32 and fp16. Every case is built to catch addressing bugs: src and dst ids
are drawn anywhere in the pool (never the identity, never in order), every block that is neither a
src nor a dst holds NaN, and the dst blocks start as NaN, so a copy from the wrong block leaves NaN in
a dst and a write to the wrong block changes bits that must stay. Comparisons are bit for bit: a copy
changes no value.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import paged_kernels
from engine.model_executor.attention import copy_blocks_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 and >2**31-element pools need a CUDA GPU")
INT_OF = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits, so that NaN compares equal to the same NaN and -0.0 differs from 0.0."""
    return t.contiguous().view(INT_OF[t.dtype])


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(bits(a), bits(b))


def cow_mapping(num_blocks: int, num_pairs: int, seed: int) -> torch.Tensor:
    """``[num_pairs, 2]`` int64 (src, dst) as copy-on-write makes them: distinct dsts, none of them a src,
    drawn anywhere in the pool; two pairs share a src when there is room (two forks of one block)."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(num_blocks, generator=gen)
    dst = perm[:num_pairs]
    sources = perm[num_pairs:]
    src = sources[torch.randint(0, len(sources), (num_pairs,), generator=gen)]
    if num_pairs >= 2 and len(sources) >= 1:
        src[1] = src[0]
    return torch.stack([src, dst], dim=1).to(DEVICE)


def make_layers(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, mapping, seed=0):
    """Per-layer K and V pools: random values in the src blocks, NaN in every other block."""
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    srcs = mapping[:, 0].cpu().unique()
    keys, values = [], []
    for _ in range(2 * num_layers):
        pool = torch.full(shape, float("nan"), dtype=dtype)
        pool[srcs] = torch.randn(len(srcs), *shape[1:], generator=gen).to(dtype)
        (keys if len(keys) < num_layers else values).append(pool.to(DEVICE))
    return keys, values


def expected_after(pool: torch.Tensor, pairs: list[tuple[int, int]]) -> torch.Tensor:
    """Block by block, from the pool as it was before: dst gets src's contents, nothing else changes."""
    out = pool.clone()
    for src, dst in pairs:
        out[dst] = pool[src]
    return out


def check_copy(keys, values, mapping):
    before_k, before_v = [k.clone() for k in keys], [v.clone() for v in values]
    ref_k, ref_v = [k.clone() for k in keys], [v.clone() for v in values]
    copy_blocks_reference(ref_k, ref_v, mapping)
    paged_kernels.copy_blocks(keys, values, mapping)
    pairs = [tuple(p) for p in mapping.tolist()]
    dsts = [d for _, d in pairs]
    for layer, (k, v) in enumerate(zip(keys, values)):
        for name, got, before, ref in (("K", k, before_k[layer], ref_k[layer]), ("V", v, before_v[layer], ref_v[layer])):
            assert same_bits(got, ref), f"layer {layer} {name} differs from copy_blocks_reference"
            assert same_bits(got, expected_after(before, pairs)), f"layer {layer} {name} differs from block-by-block copy"
            if dsts:
                assert not torch.isnan(got[dsts]).any(), f"layer {layer} {name}: a dst block was copied from a NaN block"
            untouched = [b for b in range(got.shape[0]) if b not in dsts]
            assert same_bits(got[untouched], before[untouched]), f"layer {layer} {name}: a block that is not a dst changed"


# (num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, num_pairs): block sizes 1/16/48,
# GQA pools (3 KV heads, the default model's), head_dim 64/80, fp32/fp16, one and several pairs.
CASES = [
    (3, 12, 16, 3, 64, torch.float32, 4),  # the default model's shape
    (2, 20, 1, 3, 80, torch.float16, 7),
    (2, 9, 48, 3, 80, torch.float32, 3),
    (1, 6, 16, 1, 64, torch.float16, 1),
    (4, 8, 48, 2, 64, torch.float16, 2),
]


@pytest.mark.parametrize("num_layers,num_blocks,block_size,num_kv_heads,head_dim,dtype,num_pairs", CASES)
def test_copy_blocks_matches_reference(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, num_pairs):
    mapping = cow_mapping(num_blocks, num_pairs, seed=num_blocks)
    assert not torch.equal(mapping[:, 0], mapping[:, 1])
    keys, values = make_layers(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, mapping)
    check_copy(keys, values, mapping)


def test_copy_blocks_gpu_tiling_under_the_interpreter(monkeypatch):
    """The GPU launch layout (one pair per program, a block split over several tiles, the last one
    partly masked), run under the interpreter too: 48 * 3 * 80 = 11520 values = 2.8 tiles of 4096."""
    mod = importlib.import_module("paged_kernels.copy_blocks")  # the attribute paged_kernels.copy_blocks is the function
    monkeypatch.setattr(mod, "interpreted", lambda: False)
    mapping = cow_mapping(9, 3, seed=5)
    keys, values = make_layers(2, 9, 48, 3, 80, torch.float32, mapping)
    check_copy(keys, values, mapping)


def test_copy_blocks_on_views_of_a_wider_pool():
    """Pools that are strided views (every other block, a slice of heads and of head_dim, K and V of
    all layers in one tensor): only the viewed dst values change, the margins around them do not."""
    num_layers, num_blocks, block_size, num_kv_heads, head_dim = 2, 10, 16, 3, 64
    gen = torch.Generator().manual_seed(7)
    wide = torch.randn(num_layers, 2, 2 * num_blocks, block_size, num_kv_heads + 2, head_dim + 16, generator=gen).to(DEVICE)
    view = wide[:, :, 1::2, :, 1 : 1 + num_kv_heads, 8 : 8 + head_dim]
    keys, values = list(view[:, 0]), list(view[:, 1])
    assert not keys[0].is_contiguous() and keys[0].shape == (num_blocks, block_size, num_kv_heads, head_dim)
    mapping = cow_mapping(num_blocks, 3, seed=2)
    outside = torch.ones_like(wide, dtype=torch.bool)
    outside[:, :, 1::2, :, 1 : 1 + num_kv_heads, 8 : 8 + head_dim] = False
    wide_before = wide.clone()
    check_copy(keys, values, mapping)
    assert torch.equal(wide[outside], wide_before[outside]), "a value outside the viewed pools changed"


def test_copy_blocks_reads_a_strided_block_mapping():
    """block_mapping as a view (a column slice of a wider int64 tensor) is read through its strides."""
    mapping = cow_mapping(12, 4, seed=3)
    wide = torch.full((4, 5), -7, dtype=torch.int64, device=DEVICE)
    wide[:, 1:3] = mapping
    strided = wide[:, 1:3]
    assert not strided.is_contiguous()
    keys, values = make_layers(2, 12, 16, 3, 64, torch.float32, mapping)
    check_copy(keys, values, strided)


def test_empty_mapping_copies_nothing():
    mapping = torch.empty(0, 2, dtype=torch.int64, device=DEVICE)
    keys, values = make_layers(2, 5, 16, 3, 64, torch.float32, cow_mapping(5, 2, seed=1))
    check_copy(keys, values, mapping)
    paged_kernels.copy_blocks([], [], cow_mapping(5, 2, seed=1))  # no layers: nothing to copy either


def test_copy_on_write_after_a_fork():
    """The paper's Figure 8 situation: two sequences share block 2; the writer gets fresh block 5, whose
    stale contents are replaced by block 2's; then each writes its own token without touching the other."""
    kc = torch.randn(8, 4, 3, 64).to(DEVICE)
    vc = torch.randn(8, 4, 3, 64).to(DEVICE)
    shared_k, shared_v = kc[2].clone(), vc[2].clone()
    paged_kernels.copy_blocks([kc], [vc], torch.tensor([[2, 5]], device=DEVICE))
    assert torch.equal(kc[5], shared_k) and torch.equal(vc[5], shared_v)
    new = torch.randn(2, 1, 3, 64).to(DEVICE)
    slots = torch.tensor([2 * 4 + 3, 5 * 4 + 3], device=DEVICE)  # offset 3 of the original and of the copy
    paged_kernels.reshape_and_cache(new[:, 0], new[:, 0], kc, vc, slots)
    assert torch.equal(kc[2, :3], shared_k[:3]) and torch.equal(kc[5, :3], shared_k[:3])
    assert torch.equal(kc[2, 3], new[0, 0]) and torch.equal(kc[5, 3], new[1, 0])


@settings(max_examples=25, deadline=None)
@given(
    num_layers=st.integers(1, 3),
    block_size=st.integers(1, 20),
    num_kv_heads=st.integers(1, 4),
    head_dim=st.sampled_from([1, 8, 24, 64, 80]),
    num_pairs=st.integers(0, 5),
    spare=st.integers(1, 4),
    dtype=st.sampled_from([torch.float32, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_copy_blocks_any_shape(num_layers, block_size, num_kv_heads, head_dim, num_pairs, spare, dtype, seed):
    num_blocks = num_pairs + spare
    mapping = cow_mapping(num_blocks, num_pairs, seed)
    keys, values = make_layers(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, mapping, seed)
    check_copy(keys, values, mapping)


# ---------------------------------------------------------------- validation


def test_bad_inputs_raise_a_clear_error_and_change_nothing():
    mapping = torch.tensor([[1, 4], [1, 6], [3, 0]], device=DEVICE)
    keys, values = make_layers(2, 8, 16, 3, 64, torch.float32, mapping)
    before = [t.clone() for t in keys + values]
    wrong_pairs = [
        ("int64", mapping.int()),
        ("num_pairs, 2", mapping[:, :1]),
        ("num_pairs, 2", mapping[0]),
        (r"out of range.*\[0, 8\)", torch.tensor([[1, 8]], device=DEVICE)),
        ("out of range", torch.tensor([[-1, 4]], device=DEVICE)),
        ("not distinct", torch.tensor([[1, 4], [3, 4]], device=DEVICE)),
        ("both a dst and a src", torch.tensor([[1, 4], [4, 5]], device=DEVICE)),
        ("both a dst and a src", torch.tensor([[3, 3]], device=DEVICE)),
    ]
    for match, bad in wrong_pairs:
        with pytest.raises(ValueError, match=match):
            paged_kernels.copy_blocks(keys, values, bad)
    with pytest.raises(ValueError, match="device"):
        paged_kernels.copy_blocks(keys, values, torch.zeros(1, 2, dtype=torch.int64, device="meta"))
    with pytest.raises(ValueError, match="2 key caches but 1 value caches"):
        paged_kernels.copy_blocks(keys, values[:1], mapping)
    with pytest.raises(ValueError, match="value_cache shape"):
        paged_kernels.copy_blocks(keys, [values[0], values[1][:, :8]], mapping)
    with pytest.raises(ValueError, match="layer 1 .* same shape and dtype"):
        paged_kernels.copy_blocks([keys[0], keys[1][:, :8]], [values[0], values[1][:, :8]], mapping)
    with pytest.raises(ValueError, match="layer 1 .* same shape and dtype"):
        paged_kernels.copy_blocks([keys[0], keys[1].half()], [values[0], values[1].half()], mapping)
    with pytest.raises(ValueError, match="num_blocks, block_size, num_kv_heads, head_dim"):
        paged_kernels.copy_blocks([k[0] for k in keys], [v[0] for v in values], mapping)
    with pytest.raises(ValueError, match="not supported"):
        paged_kernels.copy_blocks([k.int() for k in keys], [v.int() for v in values], mapping)
    assert all(same_bits(t, b) for t, b in zip(keys + values, before)), "a refused call wrote into a pool"
    check_copy(keys, values, mapping)  # and the kernel still works


# ---------------------------------------------------------------- CUDA only


@NEEDS_CUDA
def test_copy_blocks_bf16():
    mapping = cow_mapping(16, 5, seed=4)
    keys, values = make_layers(3, 16, 16, 3, 64, torch.bfloat16, mapping)
    check_copy(keys, values, mapping)


@NEEDS_CUDA
def test_copy_blocks_offsets_overflow_int32():
    # block_id * stride(0) > 2**31: the kernel must compute pool offsets in int64.
    kc = torch.zeros(2**31 // (16 * 128) + 64, 16, 1, 128, dtype=torch.float16, device="cuda")
    vc = torch.zeros_like(kc)
    last = kc.shape[0] - 1
    assert last * kc.stride(0) > 2**31
    kc[last].normal_()
    vc[5].normal_()
    paged_kernels.copy_blocks([kc], [vc], torch.tensor([[last, 3], [5, last - 1]], device="cuda"))
    assert torch.equal(kc[3], kc[last]) and torch.equal(vc[last - 1], vc[5]) and vc[5].abs().sum() > 0
    assert torch.count_nonzero(kc[4]) == 0 and torch.count_nonzero(vc[last - 2]) == 0
