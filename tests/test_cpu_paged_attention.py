"""The engine's CPU decode-attention kernel (engine/cpu/csrc/paged_attention.cpp) against the torch oracle.

The same correctness matrix as the Triton kernels (tests/test_kernels.py, cases from tests/paged_cases.py):
every cache slot outside a live context holds NaN, block tables are permuted and passed as views into
wider tables whose extra columns point at NaN blocks, queries are strided views of a packed QKV output.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.cpu import ops as cpu_ops
from engine.model_executor.attention import paged_attention_reference
from engine.model_executor.model_runner import CPU_KERNEL_BACKEND, TORCH_BACKEND
from paged_cases import assert_decode_output, make_paged_kv, packed_query


@pytest.fixture(scope="module")
def kernel():
    assert cpu_ops.load_kernel(), f"the kernels did not build here: {cpu_ops.kernel_error()}"
    return cpu_ops.paged_attention_decode


def check(kernel, ctx_lens, block_size, group, num_kv_heads, head_dim, dtype=torch.float32, seed=0, q_scale=1.0, k_scale=1.0, tol=None):
    kc, vc, bt, cl = make_paged_kv(ctx_lens, block_size, num_kv_heads, head_dim, dtype, seed=seed, value_scale=k_scale, device="cpu")
    q = packed_query(len(ctx_lens), group * num_kv_heads, num_kv_heads, head_dim, dtype, seed=seed + 1, scale=q_scale, device="cpu")
    scale = head_dim**-0.5
    out = kernel(q, kc, vc, bt, cl, scale)
    ref = paged_attention_reference(q, kc, vc, bt, cl, scale)
    assert_decode_output(out, ref, q, ctx_lens, tol)
    return out


# (block_size, group, num_kv_heads, head_dim, context lengths): block sizes 1, 16, 48; GQA groups 1, 3,
# 5; head_dim 64 and 128 (compiled for them) and 80, 24 (any other); contexts 0, 1, bs - 1, bs, bs + 1,
# k * bs +- 1, and more than one 32-position tile of the online softmax.
CASES = [
    (16, 3, 3, 64, [1, 15, 16, 17, 0, 47, 49]),  # the default model's shape
    (1, 1, 2, 64, [1, 2, 0, 9, 33]),
    (1, 5, 1, 80, [0, 1, 2, 65]),
    (48, 5, 1, 128, [47, 48, 49, 95, 97, 0]),
    (48, 3, 2, 64, [1, 0, 200]),
    (16, 5, 2, 24, [15, 16, 17, 1, 0]),
    (16, 1, 1, 128, [31, 32, 33, 64, 65]),
    # More sequences than threads, contexts of several spans (kSpan = 64 positions) and less than one,
    # thread ranges starting and ending at any KV head.
    (16, 3, 3, 64, [300, 0, 171, 5, 250, 1, 40]),
]


@pytest.mark.parametrize("block_size,group,num_kv_heads,head_dim,ctx_lens", CASES)
def test_decode_matches_reference(kernel, block_size, group, num_kv_heads, head_dim, ctx_lens):
    check(kernel, ctx_lens, block_size, group, num_kv_heads, head_dim)


@settings(max_examples=40, deadline=None)
@given(
    ctx_lens=st.lists(st.integers(0, 120), min_size=1, max_size=6),
    block_size=st.sampled_from([1, 2, 5, 16, 48]),
    group=st.integers(1, 6),
    num_kv_heads=st.integers(1, 3),
    head_dim=st.sampled_from([8, 24, 64, 80, 128]),
    seed=st.integers(0, 2**20),
)
def test_decode_matches_reference_for_any_shape(kernel, ctx_lens, block_size, group, num_kv_heads, head_dim, seed):
    check(kernel, ctx_lens, block_size, group, num_kv_heads, head_dim, seed=seed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_gives_the_same_bits_on_any_number_of_threads(kernel, dtype):
    # How the (sequence, KV head) tasks are shared out, and what each thread brings into L2 ahead (the
    # next span of its sequence, or its next sequence's first), must change no result.
    kc, vc, bt, cl = make_paged_kv([300, 0, 171, 5, 250, 1, 40, 17], 16, 3, 64, dtype, device="cpu")
    q = packed_query(8, 9, 3, 64, dtype, device="cpu")
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2, 3, 5):
            torch.set_num_threads(n)
            outs.append(kernel(q, kc, vc, bt, cl, 0.125))
    finally:
        torch.set_num_threads(threads)
    for out in outs[1:]:
        assert torch.equal(out, outs[0])


def test_decode_reads_contiguous_inputs_and_one_sequence(kernel):
    kc, vc, bt, cl = make_paged_kv([37], 16, 2, 64, torch.float32, device="cpu")
    q = torch.randn(1, 6, 64)
    out = kernel(q, kc, vc, bt.contiguous(), cl, 0.125)
    torch.testing.assert_close(out, paged_attention_reference(q, kc, vc, bt, cl, 0.125), atol=1e-5, rtol=1e-5)


def test_decode_bf16_matches_reference(kernel):
    check(kernel, [1, 15, 16, 17, 0, 100], 16, 3, 3, 64, dtype=torch.bfloat16)
    check(kernel, [5, 49], 48, 5, 1, 80, dtype=torch.bfloat16)


def test_decode_large_logits_do_not_overflow(kernel):
    # |q|, |k| ~ 30 elementwise: logits ~ 1e4, whose exp would overflow fp32 without the running maximum.
    out = check(kernel, [40, 17, 70], 16, 3, 1, 64, q_scale=30.0, k_scale=30.0, tol=dict(atol=2e-2, rtol=2e-2))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(query=torch.randn(2, 6, 64, dtype=torch.float64)), "one dtype"),
        (dict(query=torch.randn(2, 6, 32)), "head_dim"),
        (dict(query=torch.randn(2, 5, 64)), "multiple of num_kv_heads"),
        (dict(context_lens=torch.tensor([3, 100], dtype=torch.int32)), "does not fit"),
        (dict(context_lens=torch.tensor([3, -1], dtype=torch.int32)), "does not fit"),
        (dict(block_tables=torch.tensor([[0, 1], [99, 2]], dtype=torch.int32)), "not a block of the pool"),
        (dict(block_tables=torch.zeros(3, 2, dtype=torch.int32)), "block_tables must be"),
        (dict(query=torch.randn(2, 6, 64, requires_grad=True)), "inference only"),
    ],
)
def test_decode_refuses_bad_inputs_and_stays_usable(kernel, change, message):
    kc, vc = torch.zeros(4, 16, 2, 64), torch.zeros(4, 16, 2, 64)
    args = dict(query=torch.randn(2, 6, 64), key_cache=kc, value_cache=vc,
                block_tables=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32), context_lens=torch.tensor([3, 20], dtype=torch.int32))
    with pytest.raises(RuntimeError, match=message):
        kernel(**{**args, **change}, scale=0.125)
    vc[:] = 1.0
    assert torch.equal(kernel(**args, scale=0.125), torch.ones(2, 6, 64))  # the mean of rows of ones


def _greedy(engine: LLMEngine, prompts, max_tokens: int) -> list[list[int]]:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    while engine.has_unfinished_requests():
        engine.step()
    return [engine.get_output(i).token_ids for i in ids]


@pytest.mark.parametrize("block_size", [1, 16, 48])
def test_engine_greedy_tokens_are_the_same_with_the_kernel_and_the_reference(kernel, tiny_llama_dir, block_size):
    prompts = ["The block table maps", [{"role": "user", "content": "Hi!"}], "Paged attention " * 12]
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=block_size, num_gpu_blocks=4096 // block_size, shuffle_blocks=True))
    assert engine.runner.backend is CPU_KERNEL_BACKEND and "decode attention" in engine.cpu_backend
    with_kernel = _greedy(engine, prompts, 40)
    engine.runner.backend = TORCH_BACKEND  # the same engine, decode attention through the oracle
    assert _greedy(engine, prompts, 40) == with_kernel
    plain = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=block_size, cpu_kernels=False))
    assert plain.runner.backend is TORCH_BACKEND and plain.cpu_backend.split(";")[0] == "torch"


@pytest.mark.slow
def test_default_model_greedy_tokens_are_the_same_with_the_kernel_and_the_reference(kernel):
    prompts = [[{"role": "user", "content": f"Tell me about {topic}."}] for topic in ("black holes", "honey bees", "chess")]
    engine = LLMEngine(EngineConfig(num_gpu_blocks=64))
    assert engine.runner.backend is CPU_KERNEL_BACKEND
    with_kernel = _greedy(engine, prompts, 32)
    engine.runner.backend = TORCH_BACKEND
    assert _greedy(engine, prompts, 32) == with_kernel
