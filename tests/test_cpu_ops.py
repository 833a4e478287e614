"""The engine's CPU kernels (engine/cpu/csrc/: the small-batch matmul, add + RMSNorm, RoPE, SiLU-and-mul), built for real."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

from engine import LLM, EngineConfig, LLMEngine, SamplingParams
from engine.cpu import ops as cpu_ops
from engine.model_executor.model import Linear, RMSNorm, apply_rotary

def all_kernels() -> str:
    """The engine's CPU backend as it names itself once the kernels are loaded: with AVX-512 or AVX2 the
    matmul is the engine's too."""
    assert cpu_ops.load_kernel(), f"the kernels did not build here: {cpu_ops.kernel_error()}"
    if cpu_ops.matmul_simd() in cpu_ops.MATMUL_ISAS:
        return "engine CPU kernels (matmul, RMSNorm, RoPE, SiLU-and-mul, decode attention)"
    return "engine CPU kernels (RMSNorm, RoPE, SiLU-and-mul, decode attention), torch matmul (no AVX2)"


@pytest.fixture(scope="module")
def kernel():
    assert cpu_ops.load_kernel(), f"the kernel did not build here: {cpu_ops.kernel_error()}"
    return cpu_ops.small_batch_linear


def _loaded_library() -> Path | None:
    """The kernels' library this process loaded (Linux: read from /proc/self/maps), or None."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    for line in maps.read_text().splitlines():
        path = line.split()[-1]
        if Path(path).name.startswith("pagedattention_lab_cpu_") and path.endswith(".so"):
            return Path(path)
    return None


def _errors(x: torch.Tensor, weight: torch.Tensor, ours: torch.Tensor) -> tuple[float, float]:
    """Largest error of ours and of torch's F.linear against the float64 product."""
    exact = x.double() @ weight.double().t()
    theirs = F.linear(x, weight)
    return float((ours.double() - exact).abs().max()), float((theirs.double() - exact).abs().max())


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 70),
    k=st.integers(1, 700),
    n=st.integers(1, 300),
    seed=st.integers(0, 2**31 - 1),
)
def test_kernel_matches_the_exact_product(kernel, rows, k, n, seed):
    # Any K (vectors of 16 terms, then the last K % 16 one by one), any N (tiles of 4 weight rows,
    # then the last N % 4 one by one), row groups of up to 6 (70 rows: 12 balanced groups).
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=generator)
    weight = torch.randn(n, k, generator=generator)
    ours = kernel(x, weight)
    assert ours.shape == (rows, n) and ours.dtype == torch.float32
    ours_error, torch_error = _errors(x, weight, ours)
    # 16 interleaved partial sums, added up in a tree: of the order of a blocked GEMM's (MKL's) error.
    assert ours_error <= 4 * torch_error + 1e-5 * k**0.5


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 70), k=st.integers(1, 700), n=st.integers(1, 300), seed=st.integers(0, 2**31 - 1))
def test_bf16_kernel_is_as_close_to_the_exact_product_as_torch(kernel, rows, k, n, seed):
    # bfloat16 (AVX512-BF16's dot products of pairs, summed in fp32, vectors of 32 terms then the
    # last K % 32): both round the fp32 sum to bf16 at the end, which is most of the error.
    if not cpu_ops.matmul_bf16():
        pytest.skip("this CPU has no AVX512-BF16")
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=generator).bfloat16()
    weight = torch.randn(n, k, generator=generator).bfloat16()
    ours = kernel(x, weight)
    assert ours.shape == (rows, n) and ours.dtype == torch.bfloat16 and cpu_ops.supports(weight)
    exact = x.double() @ weight.double().t()
    ours_error = float((ours.double() - exact).abs().max())
    torch_error = float((F.linear(x, weight).double() - exact).abs().max())
    assert ours_error <= 2 * torch_error + 1e-4 * k**0.5


def test_kernel_reads_strided_inputs_and_model_sized_shapes(kernel):
    x = torch.randn(16, 2 * 576)[:, ::2]  # a non-contiguous view: copied once, then multiplied
    for n in (192, 576, 1536, 49152):
        weight = torch.randn(n, 576)
        ours_error, torch_error = _errors(x, weight, kernel(x, weight))
        assert ours_error <= 4 * torch_error + 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weight_is_panels_of_16_columns(kernel, dtype):
    # packed[p, k, j] = weight[16 p + j, k] (bf16: packed[p, k // 2, 2 j + k % 2]), zeros where the
    # last panel has no column and after an odd K: what csrc/small_batch_linear.cpp's loop reads.
    if dtype == torch.bfloat16 and not cpu_ops.matmul_bf16():
        pytest.skip("this CPU has no AVX512-BF16")
    n, k = 37, 5
    weight = torch.arange(n * k, dtype=torch.float32).view(n, k).to(dtype)
    packed = cpu_ops.pack_weight(weight)
    assert tuple(packed.shape) == cpu_ops.packed_shape(weight) == ((3, 3, 32) if dtype == torch.bfloat16 else (3, 5, 16))
    padded = torch.zeros(48, 6, dtype=dtype)
    padded[:n, :k] = weight
    if dtype == torch.bfloat16:
        expected = padded.view(3, 16, 3, 2).permute(0, 2, 1, 3).reshape(3, 3, 32)
    else:
        expected = padded[:, :k].view(3, 16, k).transpose(1, 2)
    assert torch.equal(packed, expected)
    with pytest.raises(RuntimeError, match=r"out must be a contiguous .* of shape \[3, "):
        cpu_ops.pack_weight(weight, out=torch.empty(3, 4, 16, dtype=dtype))
    with pytest.raises(RuntimeError, match="packed weight .* is not that of an"):
        torch.ops.pagedattention_lab.small_batch_linear(torch.ones(2, k + 2, dtype=dtype), packed, n)


def test_engines_on_the_same_weights_share_one_packed_copy(kernel, tiny_llama_dir):
    # The app and the lessons build several engines on one loaded model: the weights are shared, and
    # so are their packed copies, which go when the last model using them does.
    import gc

    from engine.model_executor.model_loader import load_model

    if cpu_ops.matmul_simd() not in cpu_ops.MATMUL_ISAS:
        pytest.skip("the packed matmul runs with AVX-512 or AVX2 only (elsewhere torch's matmul: nothing is packed)")

    loaded = load_model(str(tiny_llama_dir))
    first = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=16), loaded_model=loaded)
    second = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=16), loaded_model=loaded)
    a, b = first.runner.model.model.layers[0].mlp.down_proj, second.runner.model.model.layers[0].mlp.down_proj
    assert a is not b and a.weight.data_ptr() == b.weight.data_ptr()
    assert a.packed_weight is b.packed_weight and a.cpu_kernel
    assert first.runner.model.lm_head_packed is second.runner.model.lm_head_packed is not None
    before = len(cpu_ops._packed)
    del first, second, a, b
    gc.collect()
    assert len(cpu_ops._packed) < before  # freed with the models
    tokens = []
    for flag in (True, False):  # packed again after the free: the same tokens as torch's matmuls
        engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=16, cpu_kernels=flag), loaded_model=loaded)
        rid = engine.add_request("The block table maps", SamplingParams(max_tokens=6, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
        tokens.append(engine.get_output(rid).token_ids)
    assert tokens[0] == tokens[1] and len(tokens[0]) == 6


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 70),
    k=st.integers(1, 700),
    ns=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    bf16=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_several_weights_in_one_call_are_each_weight_bit_for_bit(kernel, rows, k, ns, bf16, seed):
    # decode_layer multiplies q, k and v (and gate and up) in one parallel region: a thread's share of
    # the panels runs on from one weight into the next. Each output must be that weight's own product.
    if bf16 and not cpu_ops.matmul_bf16():
        pytest.skip("this CPU has no AVX512-BF16")
    dtype = torch.bfloat16 if bf16 else torch.float32
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=generator).to(dtype)
    weights = [torch.randn(n, k, generator=generator).to(dtype) for n in ns]
    packed = [cpu_ops.pack_weight(w) for w in weights]
    outs = torch.ops.pagedattention_lab.small_batch_linears(x, packed, ns)
    assert [tuple(o.shape) for o in outs] == [(rows, n) for n in ns]
    for out, w, p in zip(outs, weights, packed):
        assert torch.equal(out, kernel(x, w, p))


def test_several_weights_in_one_call_refuse_what_they_cannot_multiply(kernel):
    x, a, b = torch.randn(2, 8), cpu_ops.pack_weight(torch.randn(32, 8)), cpu_ops.pack_weight(torch.randn(16, 9))
    with pytest.raises(RuntimeError, match=r"x is \[M, 8\] but the packed weight .* is not that of an \[16, 8\] weight"):
        torch.ops.pagedattention_lab.small_batch_linears(x, [a, b], [32, 16])
    with pytest.raises(RuntimeError, match="one N per packed weight"):
        torch.ops.pagedattention_lab.small_batch_linears(x, [a], [32, 16])
    assert torch.equal(torch.ops.pagedattention_lab.small_batch_linears(x, [a], [32])[0], kernel(x, torch.empty(32, 8), a))


def test_kernel_handles_empty_shapes(kernel):
    assert kernel(torch.randn(0, 8), torch.randn(5, 8)).shape == (0, 5)
    assert kernel(torch.randn(3, 8), torch.randn(0, 8)).shape == (3, 0)
    assert torch.equal(kernel(torch.randn(3, 0), torch.randn(5, 0)), torch.zeros(3, 5))


@pytest.mark.parametrize(
    "x, weight, message",
    [
        (torch.randn(4, 8, dtype=torch.float64), torch.randn(64, 8, dtype=torch.float64), "float32"),
        (torch.randn(4, 9), torch.randn(64, 8), r"x is \[M, 9\] but weight is \[N, 8\]"),
        (torch.randn(4, 8), torch.randn(8, 64).t(), "contiguous"),
        (torch.randn(2, 4, 8), torch.randn(64, 8), "2-D"),
    ],
)
def test_kernel_refuses_what_it_cannot_multiply(kernel, x, weight, message):
    with pytest.raises(RuntimeError, match=message):
        kernel(x, weight)
    assert not cpu_ops.supports(weight) or x.dim() != 2 or x.shape[1] != weight.shape[1] or x.dtype != weight.dtype
    ok = kernel(torch.ones(2, 8), torch.ones(64, 8))  # still usable afterwards
    assert torch.equal(ok, torch.full((2, 64), 8.0))


def test_linear_module_uses_the_kernel_for_every_batch_and_torch_under_autograd(kernel):
    torch.manual_seed(0)
    module = Linear(96, 130, bias=True)
    module.cpu_kernel, module.packed_weight = True, cpu_ops.pack_weight(module.weight)
    reference = Linear(96, 130, bias=True)
    reference.load_state_dict(module.state_dict())
    assert set(module.state_dict()) == {"weight", "bias"}  # checkpoints load by the same names
    with torch.inference_mode():
        for rows in (1, 7, 64, 65, 300):  # decode steps and prefills
            x = torch.randn(rows, 96)
            torch.testing.assert_close(module(x), reference(x), atol=1e-5, rtol=1e-5)
        packed = module.packed_weight
        module.packed_weight = cpu_ops.pack_weight(2 * module.weight)  # really the kernel, on the packed copy
        torch.testing.assert_close(module(x), F.linear(x, 2 * module.weight, module.bias), atol=1e-5, rtol=1e-5)
        module.packed_weight = packed
        x = torch.randn(300, 96)  # a prefill-sized batch: the kernel, exactly
        assert torch.equal(module(x), cpu_ops.small_batch_linear(x, module.weight, packed).add_(module.bias))
    x = torch.randn(300, 96)
    assert torch.equal(module(x), F.linear(x, module.weight, module.bias))  # gradients recorded: torch's F.linear


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 80), hidden=st.integers(1, 700), seed=st.integers(0, 2**31 - 1))
def test_add_rms_norm_matches_torch(kernel, rows, hidden, seed):
    generator = torch.Generator().manual_seed(seed)
    x, residual = torch.randn(2, rows, hidden, generator=generator)
    norm = RMSNorm(hidden, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=generator))
        normed, new_residual = cpu_ops.add_rms_norm(x, residual, norm.weight, norm.eps)
        expected_normed, expected_residual = norm(x, residual)  # the torch path
    assert torch.equal(new_residual, expected_residual)  # the same one addition per element
    # The mean of squares is summed in another order: within float rounding of torch's.
    torch.testing.assert_close(normed, expected_normed, rtol=2e-6, atol=2e-6)


@settings(max_examples=30, deadline=None)
@given(
    tokens=st.integers(1, 40), heads=st.integers(1, 9), kv_heads=st.integers(1, 3),
    half=st.integers(1, 64), seed=st.integers(0, 2**31 - 1),
)
def test_rotary_embedding_is_exactly_the_torch_rotation(kernel, tokens, heads, kv_heads, half, seed):
    generator = torch.Generator().manual_seed(seed)
    head_dim = 2 * half
    q = torch.randn(tokens, heads, head_dim, generator=generator)
    k = torch.randn(tokens, 2 * kv_heads, head_dim, generator=generator)[:, ::2]  # a strided view
    angles = torch.rand(tokens, 1, head_dim, generator=generator) * 100
    cos, sin = angles.cos(), angles.sin()
    q_rot, k_rot = cpu_ops.rotary_embedding(q, k, cos, sin)
    assert torch.equal(q_rot, apply_rotary(q, cos, sin))  # two products and a sum, never fused
    assert torch.equal(k_rot, apply_rotary(k, cos, sin))


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 80), hidden=st.integers(1, 700), heads=st.integers(1, 9), half=st.integers(1, 64), seed=st.integers(0, 2**31 - 1))
def test_bf16_add_rms_norm_and_rotary_are_exactly_the_torch_code(kernel, rows, hidden, heads, half, seed):
    # In bf16 the kernels round where the torch code of engine/model_executor/model.py rounds (the residual sum, the
    # normalised value, its product with the weight; RoPE's two products and their sum), and the
    # mean of squares is fp32 in both: the same bf16 values, bit for bit, on these inputs.
    generator = torch.Generator().manual_seed(seed)
    x, residual = (torch.randn(2, rows, hidden, generator=generator) * 4).bfloat16()
    norm = RMSNorm(hidden, eps=1e-5).bfloat16()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=generator))
        normed, new_residual = cpu_ops.add_rms_norm(x, residual, norm.weight, norm.eps)
        expected_normed, expected_residual = norm(x, residual)
    assert new_residual.dtype == normed.dtype == torch.bfloat16
    assert torch.equal(new_residual, expected_residual)
    # mean of squares summed in another order: the normalised value at most one bf16 step apart, and
    # rarely; times the weight and rounded again, that step can become two (relative 2^-7 each: rows=74,
    # hidden=601, seed=3624 gives 0.48828 against 0.49219 at [3, 271])
    assert (normed != expected_normed).float().mean() <= 0.01
    torch.testing.assert_close(normed, expected_normed, rtol=2 ** -6, atol=1e-30)
    q = torch.randn(rows, heads, 2 * half, generator=generator).bfloat16()
    k = torch.randn(rows, 1, 2 * half, generator=generator).bfloat16()
    angles = torch.rand(rows, 1, 2 * half, generator=generator) * 100
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    q_rot, k_rot = cpu_ops.rotary_embedding(q, k, cos, sin)
    assert torch.equal(q_rot, apply_rotary(q, cos, sin)) and torch.equal(k_rot, apply_rotary(k, cos, sin))


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 70), width=st.integers(1, 1600), scale=st.sampled_from([0.1, 1.0, 8.0, 40.0]), seed=st.integers(0, 2**31 - 1))
def test_silu_and_mul_matches_torch(kernel, rows, width, scale, seed):
    generator = torch.Generator().manual_seed(seed)
    gate, up = torch.randn(2, rows, width, generator=generator) * torch.tensor([scale, 1.0]).view(2, 1, 1)
    exact = F.silu(gate.double()) * up.double()
    ours = cpu_ops.silu_and_mul(gate, up)
    assert ours.shape == gate.shape and ours.dtype == torch.float32
    # The exp is a degree-6 polynomial: within a few float roundings of the exact value, as torch's is.
    torch.testing.assert_close(ours.double(), exact, rtol=2e-6, atol=1e-30)
    theirs = F.silu(gate) * up
    torch.testing.assert_close(ours, theirs, rtol=2e-6, atol=1e-30)


@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.integers(1, 90), min_size=1, max_size=5), heads=st.sampled_from([(9, 3), (4, 4), (8, 2), (2, 1)]),
       head_dim=st.sampled_from([16, 32, 64, 128]), scale=st.sampled_from([0.05, 0.125, 1.0]), seed=st.integers(0, 2**31 - 1))
def test_prefill_attention_is_the_padded_reference_without_the_padding(kernel, lens, heads, head_dim, scale, seed):
    # Prompts of any lengths packed back to back (blocks of keys cut anywhere in them, the last one part
    # masked), grouped-query heads, head_dim at compile-time and run-time widths: what the torch path,
    # which pads the prompts and runs torch's flash attention, computes, within float32 rounding.
    from engine.model_executor.attention import prefill_varlen_reference
    generator = torch.Generator().manual_seed(seed)
    num_heads, num_kv_heads = heads
    tokens = sum(lens)
    q = torch.randn(tokens, num_heads, head_dim, generator=generator) * 2
    k, v = torch.randn(2, tokens, num_kv_heads, head_dim, generator=generator)
    starts = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    with torch.inference_mode():
        ours = cpu_ops.prefill_attention(q, k, v, starts, scale)
        theirs = prefill_varlen_reference(q, k, v, starts, scale)
    assert ours.shape == q.shape and ours.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=2e-5)
    first = cpu_ops.prefill_attention(q[: lens[0]], k[: lens[0]], v[: lens[0]], starts[:2], scale)
    assert torch.equal(ours[: lens[0]], first)  # a prompt's rows do not depend on the prompts beside it


def test_prefill_attention_refuses_what_it_cannot_run_and_the_engine_takes_the_torch_path_there(kernel):
    q, k = torch.randn(6, 4, 64), torch.randn(6, 2, 64)
    starts = torch.tensor([0, 2, 6])
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match="float32 only"):
            cpu_ops.prefill_attention(q.bfloat16(), k.bfloat16(), k.bfloat16(), starts, 0.125)
        with pytest.raises(RuntimeError, match="must be a multiple of"):
            cpu_ops.prefill_attention(q[:, :3], k, k, starts, 0.125)
        with pytest.raises(RuntimeError, match="query_start_loc must run from 0 to num_tokens"):
            cpu_ops.prefill_attention(q, k, k, torch.tensor([0, 2, 5]), 0.125)
        with pytest.raises(RuntimeError, match="scale must be > 0"):
            cpu_ops.prefill_attention(q, k, k, starts, 0.0)
        assert cpu_ops.prefill_attention_runs(q, k)
        # A sliding window, bf16 or a head_dim of 40 go through the torch reference, with the same answer.
        assert not cpu_ops.prefill_attention_runs(q, k, sliding_window=4)
        assert not cpu_ops.prefill_attention_runs(q.bfloat16(), k.bfloat16())
        assert not cpu_ops.prefill_attention_runs(torch.randn(6, 4, 40), torch.randn(6, 2, 40))
        from engine.model_executor.attention import prefill_varlen_reference
        from engine.model_executor.model_runner import prefill_varlen_cpu
        q40, k40 = torch.randn(6, 4, 40), torch.randn(6, 2, 40)
        assert torch.equal(prefill_varlen_cpu(q40, k40, k40, starts, 0.2), prefill_varlen_reference(q40, k40, k40, starts, 0.2))
        windowed = prefill_varlen_cpu(q, k, k, starts, 0.125, sliding_window=2)
        assert torch.equal(windowed, prefill_varlen_reference(q, k, k, starts, 0.125, sliding_window=2))


def test_silu_and_mul_at_the_ends_of_the_range_and_in_bf16(kernel):
    gate = torch.tensor([-1000.0, -100.0, -87.0, -20.0, -1e-3, 0.0, 1e-3, 20.0, 87.0, 100.0, 1000.0])
    up = torch.full_like(gate, 3.0)
    ours = cpu_ops.silu_and_mul(gate, up)
    torch.testing.assert_close(ours.double(), F.silu(gate.double()) * 3.0, rtol=2e-6, atol=1e-30)
    generator = torch.Generator().manual_seed(1)
    g, u = (torch.randn(2, 16, 1536, generator=generator) * 4).bfloat16()
    ours = cpu_ops.silu_and_mul(g, u)
    assert ours.dtype == torch.bfloat16
    expected = (F.silu(g.float()) * u.float()).bfloat16()  # computed in fp32, rounded once
    assert (ours.float() - expected.float()).abs().max() <= expected.float().abs().max() * 2**-7  # one bf16 step at most


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 37, 300])
def test_in_place_norm_and_activation_write_the_same_values_into_their_inputs(kernel, dtype, rows):
    # What a prefill's layers call (engine/model_executor/model.py): the in-place forms must give the fresh-output
    # forms' values bit for bit, in the tensors they were given, and leave the other inputs alone.
    generator = torch.Generator().manual_seed(rows)
    x, residual = torch.randn(2, rows, 576, generator=generator).to(dtype)
    weight = torch.randn(576, generator=generator).to(dtype)
    normed, summed = cpu_ops.add_rms_norm(x, residual, weight, 1e-5)
    x_in, residual_in, weight_before = x.clone(), residual.clone(), weight.clone()
    out_x, out_residual = cpu_ops.add_rms_norm_(x_in, residual_in, weight, 1e-5)
    assert out_x is x_in and out_residual is residual_in
    assert torch.equal(x_in, normed) and torch.equal(residual_in, summed) and torch.equal(weight, weight_before)
    gate, up = torch.randn(2, rows, 1536, generator=generator).to(dtype) * torch.tensor([3.0, 1.0]).to(dtype).view(2, 1, 1)
    expected = cpu_ops.silu_and_mul(gate, up)
    gate_in, up_before = gate.clone(), up.clone()
    assert cpu_ops.silu_and_mul_(gate_in, up) is gate_in
    assert torch.equal(gate_in, expected) and torch.equal(up, up_before)


def test_in_place_forms_refuse_what_they_cannot_write_and_the_model_takes_the_fresh_form_there(kernel):
    x = torch.randn(4, 16)
    with pytest.raises(RuntimeError, match="contiguous"):
        cpu_ops.add_rms_norm_(torch.randn(16, 4).t(), x.clone(), torch.ones(16), 1e-6)
    with pytest.raises(RuntimeError, match="two tensors"):
        cpu_ops.add_rms_norm_(x, x, torch.ones(16), 1e-6)
    with pytest.raises(RuntimeError, match="contiguous"):
        cpu_ops.silu_and_mul_(torch.randn(16, 4).t(), torch.randn(4, 16))
    with pytest.raises(RuntimeError, match="two tensors"):
        cpu_ops.silu_and_mul_(x, x)
    norm = RMSNorm(16, eps=1e-6)
    norm.cpu_kernel = True
    strided = torch.randn(16, 4).t()  # a view: the norm takes add_rms_norm, and the view is left as it was
    before = strided.clone()
    with torch.no_grad():
        normed, summed = norm(strided, x)
    assert torch.equal(strided, before) and torch.equal(summed, strided + x)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: cpu_ops.silu_and_mul(torch.randn(2, 8), torch.randn(2, 7)), "one shape"),
        (lambda: cpu_ops.silu_and_mul(torch.randn(2, 8, dtype=torch.float64), torch.randn(2, 8, dtype=torch.float64)), "float32 or bfloat16"),
        (lambda: cpu_ops.silu_and_mul(torch.randn(2, 8), torch.randn(2, 8).bfloat16()), "float32 or bfloat16"),
        (lambda: cpu_ops.add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.ones(8), 1e-6), "x and residual"),
        (lambda: cpu_ops.add_rms_norm(torch.randn(2, 8), torch.randn(2, 8), torch.ones(7), 1e-6), r"weight must be \[hidden\]"),
        (lambda: cpu_ops.add_rms_norm(*torch.randn(2, 2, 8, dtype=torch.float64), torch.ones(8, dtype=torch.float64), 1e-6), "float32"),
        (lambda: cpu_ops.add_rms_norm(*torch.randn(2, 2, 8), torch.ones(8).bfloat16(), 1e-6), "all inputs alike"),
        (lambda: cpu_ops.rotary_embedding(torch.randn(2, 4, 8).bfloat16(), torch.randn(2, 1, 8), torch.ones(2, 1, 8), torch.ones(2, 1, 8)), "all inputs alike"),
        (lambda: cpu_ops.rotary_embedding(torch.randn(2, 4, 8), torch.randn(3, 1, 8), torch.ones(2, 1, 8), torch.ones(2, 1, 8)), "q is"),
        (lambda: cpu_ops.rotary_embedding(torch.randn(2, 4, 7), torch.randn(2, 1, 7), torch.ones(2, 1, 7), torch.ones(2, 1, 7)), "even"),
        (lambda: cpu_ops.rotary_embedding(torch.randn(2, 4, 8), torch.randn(2, 1, 8), torch.ones(1, 1, 8), torch.ones(2, 1, 8)), "cos and sin"),
        # cos and sin as [head_dim, num_tokens]: the right number of values, the wrong shape
        (lambda: cpu_ops.rotary_embedding(torch.randn(2, 4, 8), torch.randn(2, 1, 8), torch.ones(8, 2), torch.ones(8, 2)), "cos and sin"),
        (lambda: cpu_ops.small_batch_linear(torch.randn(2, 8, requires_grad=True), torch.randn(4, 8)), "inference only"),
    ],
)
def test_fused_ops_refuse_bad_shapes_and_stay_usable(kernel, call, message):
    with pytest.raises(RuntimeError, match=message):
        call()
    normed, summed = cpu_ops.add_rms_norm(torch.ones(1, 4), torch.ones(1, 4), torch.full((4,), 3.0), 0.0)
    assert torch.equal(summed, torch.full((1, 4), 2.0)) and torch.allclose(normed, torch.full((1, 4), 3.0))


def test_engine_gives_the_same_tokens_with_and_without_the_kernel(tiny_llama_dir, kernel):
    prompts = ["The block table maps", [{"role": "user", "content": "Hi!"}], "Paged attention"]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    outputs = {}
    for flag in (True, False):
        engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), cpu_kernels=flag, num_gpu_blocks=64))
        assert engine.cpu_backend.split(";")[0] == (all_kernels() if flag else "torch")
        model = engine.runner.model
        layer = model.model.layers[0]
        assert layer.post_attention_layernorm.cpu_kernel == layer.self_attn.cpu_kernel == flag
        assert layer.mlp.up_proj.cpu_kernel == (flag and cpu_ops.matmul_simd() in cpu_ops.MATMUL_ISAS), "the matmul kernel wants AVX-512 or AVX2"
        assert layer.mlp.cpu_kernel == flag
        assert model.cpu_kernels == (flag and cpu_ops.matmul_simd() in cpu_ops.MATMUL_ISAS)  # the LM head, a matmul
        ids = [engine.add_request(p, params) for p in prompts]
        while engine.has_unfinished_requests():
            engine.step()
        outputs[flag] = [engine.get_output(i).token_ids for i in ids]
    assert outputs[True] == outputs[False]


def test_cpu_kernels_setting_is_checked():
    with pytest.raises(ValueError, match="cpu_kernels"):
        EngineConfig(cpu_kernels="yes")


def test_a_failed_build_warns_and_falls_back_to_torch(tmp_path, tiny_llama_dir):
    # A real failed build: no compiler where torch.utils.cpp_extension looks for one (CXX).
    script = textwrap.dedent(
        f"""
        import warnings
        from engine import LLM, EngineConfig, LLMEngine, SamplingParams
        from engine.cpu import ops as cpu_ops
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert cpu_ops.load_kernel({str(tmp_path / "build")!r}) is False
        messages = [str(w.message) for w in caught if "could not be built" in str(w.message)]
        assert len(messages) == 1, [str(w.message) for w in caught]
        assert "no-such-compiler" in messages[0][-300:], messages[0]  # the compiler's own words, at the end
        print("error:", cpu_ops.kernel_error()[:200])
        engine = LLMEngine(EngineConfig(model={str(tiny_llama_dir)!r}))
        assert engine.cpu_backend.split(";")[0] == "torch"
        rid = engine.add_request("hello", SamplingParams(max_tokens=3, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
        assert len(engine.get_output(rid).token_ids) == 3
        print("served")
        """
    )
    env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "served" in result.stdout


def test_a_build_killed_midway_never_hangs_the_next_start(tmp_path):
    """The issue's reproduction: SIGTERM during the first build leaves torch's lock file behind (the
    next start used to wait for it silently, up to 10 minutes). A start that finds the build lock held by
    a live process says which process it waits for, and goes on as soon as that process is gone."""
    root = str(tmp_path)
    build = f"from engine.cpu import ops as cpu_ops\nassert cpu_ops.load_kernel({root!r}), cpu_ops.kernel_error()\nprint('built')"
    first = subprocess.Popen([sys.executable, "-c", build], stderr=subprocess.PIPE, text=True)
    assert "Building the engine's CPU kernels" in first.stderr.readline()
    time.sleep(3)  # the compiler is running now
    first.send_signal(signal.SIGTERM)
    first.wait(timeout=60)
    build_dir = next(p for p in tmp_path.iterdir() if p.is_dir())
    # What a build killed inside torch's build leaves behind: its lock file. (The compile runs in a child
    # process, which may not have reached torch's build 3 s in on a loaded machine: then the file is made here.)
    (build_dir / "lock").touch()

    # A live process holds the lock (as a second, concurrent start would): the next start says so.
    hold = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from engine.cpu import ops as cpu_ops
        with cpu_ops.build_lock(Path({str(build_dir)!r})):
            print("holding", flush=True)
            time.sleep(600)
        """
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "holding"
    second = subprocess.Popen([sys.executable, "-c", build], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert second.stderr.readline().startswith(f"Waiting for process {holder.pid}, which is building")
    holder.kill()  # the OS releases its lock
    holder.wait(timeout=30)
    out, err = second.communicate(timeout=400)  # one build (10-60 s, more on a loaded machine), no 600 s wait
    assert second.returncode == 0, err[-3000:]
    assert "built" in out and "Building the engine's CPU kernels" in err
    # The next start loads what was built, at once. (torch up to 2.13 removes its lock file after a
    # build; from 2.14 on it is an OS lock, and the file stays, unheld.)
    third = subprocess.run([sys.executable, "-c", build], capture_output=True, text=True, timeout=120)
    assert third.returncode == 0 and "built" in third.stdout, third.stderr[-3000:]
    assert "Building" not in third.stderr and "Waiting" not in third.stderr
    # A finished build in a cache whose lock file cannot be opened (a read-only lab image: the open
    # raises OSError as here, where a directory stands in its place) is loaded, not given up for torch's.
    (build_dir / "build.lock").unlink()
    (build_dir / "build.lock").mkdir()
    fourth = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", build], capture_output=True, text=True, timeout=120)
    assert fourth.returncode == 0 and "built" in fourth.stdout, fourth.stderr[-3000:]


def test_ctrl_c_during_a_build_in_a_worker_thread_says_one_line(tmp_path):
    """Ctrl-C on the app's server during the kernel build: the terminal's SIGINT reaches the
    whole process group (the server's main thread and ninja), while the build runs in the script
    thread. One line, exit status 130 (no fallback warning, no C++ abort "terminate called without an
    active exception"), and the next start builds cleanly."""
    script = textwrap.dedent(
        f"""
        import signal, threading, time
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, even under a shell's background job
        from engine.cpu import ops as cpu_ops
        worker = threading.Thread(target=cpu_ops.load_kernel, args=({str(tmp_path)!r},), daemon=True)
        worker.start()  # as Streamlit's script thread
        try:
            while True:
                time.sleep(0.1)
        except KeyboardInterrupt:  # the server's main thread stops (Streamlit: "Stopping...")
            pass
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert "Building the engine's CPU kernels" in proc.stderr.readline()
    time.sleep(3)  # the compiler is running now
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError("the process did not end within 120 s of Ctrl-C") from None
    assert err.strip().splitlines() == [cpu_ops.INTERRUPTED], err[-2000:]
    assert proc.returncode == 130
    build = f"from engine.cpu import ops as cpu_ops\nassert cpu_ops.load_kernel({str(tmp_path)!r}), cpu_ops.kernel_error()"
    again = subprocess.run([sys.executable, "-c", build], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]


def test_bench_cpu_command_times_both_sides(tiny_llama_dir):
    cmd = [sys.executable, "-m", "engine", "bench-cpu", "--model", str(tiny_llama_dir), "--rows", "1", "3", "--repeats", "1"]
    result = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert set(data["matmul_ms"]) == set(data["norm_rope_ms"]) == set(data["attention_ms"]) == {"1", "3"}
    timed = [*data["matmul_ms"].values(), *data["norm_rope_ms"].values(), *data["attention_ms"].values()]
    assert all(t["kernel"] > 0 and t["torch"] > 0 for t in timed) and data["context"] == 128
    assert data["isa"]["isa"] == data["matmul_simd"] == cpu_ops.build_isa()  # the ISA it ran on, this CPU's here
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert text.returncode == 0 and "speed-up" in text.stdout and f"measured on: ISA {data['isa']['isa']} (" in text.stdout
    bad = subprocess.run(cmd[:-5] + ["--rows", "0"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "--rows must be at least 1" in bad.stderr


def test_each_isa_has_its_own_build_and_a_cpu_never_gets_one_above_it(monkeypatch, tmp_path):
    """The ISA is read from the CPU's flags, a forced one (PAGEDATTENTION_LAB_CPU_ISA) must be one the CPU runs,
    and each ISA's flags name a fixed target, so its build has a directory of its own, shared by every CPU of
    that ISA (a classroom's laptops) whatever their model."""
    laptop = {"fpu", "sse2", "avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"}
    server = laptop | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
    assert [cpu_ops.cpu_isa(f, "x86_64") for f in (server, laptop, {"fpu", "sse2"})] == ["avx512", "avx2", "generic"]
    assert cpu_ops.cpu_isa(laptop - {"fma"}, "x86_64") == "generic"  # AVX2 without FMA: x86-64-v3 is both
    assert cpu_ops.cpu_isa(server, "aarch64") == "generic"
    monkeypatch.setenv(cpu_ops.ISA_ENV_VAR, "avx2")
    assert cpu_ops.build_isa(server, "x86_64") == "avx2"
    monkeypatch.setenv(cpu_ops.ISA_ENV_VAR, "avx512")
    with pytest.raises(ValueError, match="this CPU runs avx2 at most"):
        cpu_ops.build_isa(laptop, "x86_64")
    monkeypatch.setenv(cpu_ops.ISA_ENV_VAR, "neon")
    with pytest.raises(ValueError, match="not one of avx512, avx2, generic"):
        cpu_ops.build_isa(laptop, "x86_64")
    flags = {isa: cpu_ops.build_flags(isa, server, "x86_64") for isa in cpu_ops.ISAS}
    assert not any("-march=native" in f for f in flags.values())
    assert len({cpu_ops.build_directory(tmp_path, f) for f in flags.values()}) == 3
    other_laptop = laptop | {"sha_ni", "vaes"}
    assert cpu_ops.build_flags("avx2", laptop, "x86_64") == cpu_ops.build_flags("avx2", other_laptop, "x86_64")
    assert "-mavx512bf16" in cpu_ops.build_flags("avx512", server | {"avx512_bf16"}, "x86_64")
    assert "-mavx512bf16" not in flags["avx512"]


def test_a_forced_isa_caps_torch_and_vllm_beside_it_as_on_a_laptop(monkeypatch):
    """PAGEDATTENTION_LAB_CPU_ISA=avx2 measures what an AVX2 laptop runs, not only the engine's own kernels:
    `import engine` caps ATen, MKL and oneDNN before torch loads, a variable set by hand is kept, and vLLM's
    environment makes vLLM pick its AVX2 kernel library (its platform asks torch.cpu, which reads the CPU)."""
    from engine.cpu import isa
    from engine.vllm_bridge.env import ISA_SITE, runtime_env

    if cpu_ops.cpu_isa() == "generic":
        pytest.skip("this CPU has no AVX2")
    probe = ("import engine, os, torch, torch.cpu; print(torch.backends.cpu.get_cpu_capability(), "
             "os.environ['MKL_ENABLE_INSTRUCTIONS'], os.environ['ONEDNN_MAX_CPU_ISA'], torch.cpu._is_avx512_supported())")
    clean = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")}
    run = lambda **env: subprocess.run([sys.executable, "-c", probe], env={**clean, **env}, capture_output=True, text=True, timeout=120)
    capped = run(PAGEDATTENTION_LAB_CPU_ISA="avx2")
    assert capped.returncode == 0, capped.stderr
    assert capped.stdout.split()[:3] == ["AVX2", "AVX2", "AVX2"]
    kept = run(PAGEDATTENTION_LAB_CPU_ISA="avx2", ONEDNN_MAX_CPU_ISA="AVX2_VNNI")
    assert kept.stdout.split()[2] == "AVX2_VNNI"
    monkeypatch.delenv(isa.ISA_ENV_VAR, raising=False)
    assert isa.apply_isa_caps() == {} and runtime_env().get("PYTHONPATH") != str(ISA_SITE)
    monkeypatch.setenv(isa.ISA_ENV_VAR, "avx2")
    env = runtime_env()
    assert env["PYTHONPATH"] == str(ISA_SITE) and env["ONEDNN_MAX_CPU_ISA"] == "AVX2" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    # The sitecustomize vLLM's interpreter loads: here with the lab's own torch, whose torch.cpu vLLM asks.
    site = subprocess.run([sys.executable, "-c", "import torch.cpu; print(torch.cpu._is_avx512_supported(), torch.cpu._is_amx_tile_supported())"],
                          env={**clean, "PYTHONPATH": str(ISA_SITE)}, capture_output=True, text=True, timeout=120)
    assert site.stdout.split() == ["False", "False"], site.stderr


@pytest.fixture(scope="module")
def avx2_build(tmp_path_factory, tiny_llama_dir):
    """The kernels built for AVX2 (x86-64-v3) in a fresh cache, in a process of their own (one library per
    process), where this CPU runs AVX2 or more: the one extra build of this test run (none where this process's own
    build is the AVX2 one: a copy of it is loaded, as a cache copied between two AVX2 machines). The cache first holds
    this process's own build, copied twice as a cache copied between machines would be: under its own
    directory, and renamed into the AVX2 build's directory. Returns (stdout, stderr, AVX2 library path)."""
    if cpu_ops.cpu_isa() == "generic":
        pytest.skip("this CPU has no AVX2")
    assert cpu_ops.load_kernel(), cpu_ops.kernel_error()
    root = tmp_path_factory.mktemp("avx2_cache")
    avx2_dir = cpu_ops.build_directory(root, cpu_ops.build_flags("avx2"))
    built = _loaded_library()
    ignore = shutil.ignore_patterns("*.lock", "lock")
    if built is not None and cpu_ops.matmul_simd() != "avx2":
        shutil.copytree(built.parent, root / built.parent.name, ignore=ignore)
        shutil.copytree(built.parent, avx2_dir, ignore=ignore)
        (avx2_dir / built.name).rename(avx2_dir / f"pagedattention_lab_cpu_{avx2_dir.name}.so")
    elif built is not None:  # this CPU's own build is the AVX2 one (a laptop, CI): its copy is loaded, not built again
        shutil.copytree(built.parent, avx2_dir, ignore=ignore)
    script = AVX2_CHECKS.replace("ROOT", repr(str(root))).replace("MODEL", repr(str(tiny_llama_dir)))
    env = dict(os.environ, **{cpu_ops.ISA_ENV_VAR: "avx2"})
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, result.stderr, avx2_dir / f"pagedattention_lab_cpu_{avx2_dir.name}.so"


# Run in the AVX2 build's process: what every kernel gives there against torch (the same checks as the
# tests of this file and test_cpu_paged_attention.py, in fewer shapes) and what the engine then runs.
AVX2_CHECKS = textwrap.dedent(
    """
    import torch
    from torch.nn import functional as F
    from engine.cpu import ops as cpu_ops
    from engine.model_executor.model import apply_rotary
    from engine.model_executor.attention import paged_attention_reference
    assert cpu_ops.load_kernel(ROOT), cpu_ops.kernel_error()
    assert cpu_ops.matmul_simd() == "avx2" and cpu_ops.supports(torch.ones(4, 4)) and not cpu_ops.matmul_bf16()
    g = torch.Generator().manual_seed(0)
    for rows, k, n in [(1, 576, 192), (7, 37, 13), (16, 1536, 576), (64, 15, 5), (70, 701, 33)]:
        x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
        exact = x.double() @ w.double().t()
        ours = (cpu_ops.small_batch_linear(x, w).double() - exact).abs().max()
        theirs = (F.linear(x, w).double() - exact).abs().max()
        assert ours <= 4 * theirs + 1e-5 * k ** 0.5, (rows, k, n, float(ours), float(theirs))
    x, r, w = torch.randn(5, 576, generator=g), torch.randn(5, 576, generator=g), torch.randn(576, generator=g)
    normed, summed = cpu_ops.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(summed, x + r)
    torch.testing.assert_close(normed, w * F.rms_norm(x + r, (576,), eps=1e-6), rtol=2e-6, atol=2e-6)
    q, kk = torch.randn(4, 9, 64, generator=g), torch.randn(4, 3, 64, generator=g)
    angles = torch.rand(4, 1, 64, generator=g) * 50
    q_rot, k_rot = cpu_ops.rotary_embedding(q, kk, angles.cos(), angles.sin())
    assert torch.equal(q_rot, apply_rotary(q, angles.cos(), angles.sin()))
    assert torch.equal(k_rot, apply_rotary(kk, angles.cos(), angles.sin()))
    for dtype in (torch.float32, torch.bfloat16):
        gate, up = (torch.randn(2, 5, 1539, generator=g) * 6).to(dtype)
        torch.testing.assert_close(cpu_ops.silu_and_mul(gate, up), (F.silu(gate.float()) * up.float()).to(dtype),
                                   rtol=2e-6 if dtype == torch.float32 else 8e-3, atol=1e-30)
    logits = torch.randn(5, 49157, generator=g)
    logits[1, 7], logits[2, 300] = float("nan"), logits[2].max() + 1
    logits[3, 40000:40002] = logits[3].max() + 2  # a tie: the first one
    assert torch.equal(cpu_ops.greedy_tokens(logits), logits.argmax(dim=-1))
    for dim, dtype, window in [(64, torch.float32, 0), (128, torch.float32, 0), (40, torch.float32, 0),
                               (64, torch.bfloat16, 0), (64, torch.float32, 7)]:
        kc, vc = torch.randn(2, 9, 16, 2, dim, generator=g).to(dtype)
        tables = torch.tensor([[3, 1, 8], [0, 5, 2], [4, 6, 7]], dtype=torch.int32)
        lens, q = torch.tensor([37, 9, 0], dtype=torch.int32), torch.randn(3, 6, dim, generator=g).to(dtype)
        expected = paged_attention_reference(q, kc, vc, tables, lens, 0.125, sliding_window=window or None)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(cpu_ops.paged_attention_decode(q, kc, vc, tables, lens, 0.125, sliding_window=window),
                                   expected, atol=tol, rtol=tol)
    for fp8 in (torch.float8_e4m3fn, torch.float8_e5m2):
        kc, vc = (torch.randn(2, 9, 16, 2, 64, generator=g) * 4).to(fp8)
        tables, lens = torch.tensor([[3, 1, 8]], dtype=torch.int32), torch.tensor([40], dtype=torch.int32)
        q = torch.randn(1, 6, 64, generator=g)
        expected = paged_attention_reference(q, kc.float() * 0.5, vc.float() * 2.0, tables, lens, 0.125)
        torch.testing.assert_close(cpu_ops.paged_attention_decode(q, kc, vc, tables, lens, 0.125, k_scale=0.5, v_scale=2.0),
                                   expected, atol=1e-5, rtol=1e-5)
    from engine import LLM, SamplingParams
    llm = LLM(MODEL, num_gpu_blocks=16)
    print("backend:", llm.engine.cpu_backend)
    out = llm.generate(["The capital of France is", "Paged attention"], SamplingParams(max_tokens=6, temperature=0.0))
    print("tokens:", [o.token_ids for o in out])
    """
)


def test_a_cache_built_for_another_isa_is_rebuilt_never_loaded(avx2_build):
    # A cache copied from an AVX-512 machine (prepare-room) onto an AVX2 laptop: loading its library
    # there would stop the first decode step with SIGILL. Whether found under its own directory or renamed
    # into the AVX2 build's, it is built again for AVX2.
    if cpu_ops.matmul_simd() == "avx2":
        pytest.skip("this CPU's own build is the AVX2 one: no other ISA's build to copy")
    _, stderr, library = avx2_build
    assert "Building the engine's CPU kernels for this machine (avx2;" in stderr, stderr[-3000:]
    assert (library.parent / "loaded-ok").read_text().strip() == "avx2"


@pytest.mark.skipif(not shutil.which("objdump"), reason="reads the library's instructions with objdump (binutils)")
def test_the_avx2_build_has_no_avx512_instruction(avx2_build):
    """Not one instruction on a zmm or mask register (AVX-512's), so an AVX2 laptop never meets a SIGILL."""
    *_, library = avx2_build
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)], capture_output=True, text=True, check=True).stdout
    assert "vfmadd" in text and "%ymm" in text  # the AVX2 + FMA code is there
    avx512 = [line for line in text.splitlines() if "%zmm" in line or "%k1" in line or "{%k" in line]
    assert not avx512, avx512[:5]


def test_the_avx2_build_gives_torchs_results_and_the_engine_runs_all_its_kernels(avx2_build, tiny_llama_dir):
    stdout, *_ = avx2_build
    backend = next(line for line in stdout.splitlines() if line.startswith("backend: ")).removeprefix("backend: ")
    assert backend.split(";")[0] == "engine CPU kernels (matmul, RMSNorm, RoPE, SiLU-and-mul, decode attention)", backend
    out = LLM(str(tiny_llama_dir), num_gpu_blocks=16).generate(["The capital of France is", "Paged attention"],
                                                               SamplingParams(max_tokens=6, temperature=0.0))
    assert f"tokens: {[o.token_ids for o in out]}" in stdout  # greedy tokens identical to this process's build


def test_kernels_under_autograd_fall_back_to_torch_and_the_ops_refuse_grad(kernel, tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=16))
    layer = engine.runner.model.model.layers[0]
    x = torch.randn(3, layer.mlp.gate_proj.in_features, requires_grad=True)
    layer.mlp.gate_proj(x).sum().backward()  # gradients recorded: F.linear, so they reach x
    assert x.grad is not None and x.grad.abs().sum() > 0
    with pytest.raises(RuntimeError, match="inference only"):
        cpu_ops.add_rms_norm(x, x.detach(), layer.input_layernorm.weight, 1e-6)
    with torch.no_grad():  # no gradients: the same call is fine
        cpu_ops.add_rms_norm(x, x, layer.input_layernorm.weight, 1e-6)


def test_a_half_written_library_is_rebuilt_not_loaded(kernel, tmp_path):
    # A build killed while linking (or a full disk) leaves a truncated .so next to up-to-date object
    # files, so ninja would not rebuild it, and loading it kills the process (SIGBUS). A library no
    # process has loaded yet is built again from scratch.
    script = textwrap.dedent(
        f"""
        import torch
        from engine.cpu import ops as cpu_ops
        assert cpu_ops.load_kernel({str(tmp_path)!r}), cpu_ops.kernel_error()
        assert torch.equal(cpu_ops.small_batch_linear(torch.ones(2, 8), torch.ones(3, 8)), torch.full((2, 3), 8.0))
        print("loaded")
        """
    )
    # The first build is the one this test run already made (the `kernel` fixture): a copy of its
    # directory is what a build into tmp_path would leave, and it loads without building again.
    built = _loaded_library()
    if built is not None:
        shutil.copytree(built.parent, tmp_path / built.parent.name, ignore=shutil.ignore_patterns("*.lock", "lock"))
    first = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0 and "loaded" in first.stdout, first.stderr[-3000:]
    assert built is None or "Building" not in first.stderr, first.stderr[-3000:]
    (library,) = tmp_path.glob("*/pagedattention_lab_cpu_*.so")
    library.write_bytes(library.read_bytes()[:10000])  # what a killed link step leaves
    (library.parent / "loaded-ok").unlink()  # no process ever loaded it
    again = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, (again.returncode, again.stderr[-3000:])
    assert "loaded" in again.stdout and "Building the engine's CPU kernels" in again.stderr


def test_bench_cpu_without_a_compiler_says_so_in_one_line(tmp_path, tiny_llama_dir):
    env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), PAGEDATTENTION_LAB_CACHE=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "engine", "bench-cpu", "--model", str(tiny_llama_dir), "--rows", "1", "--repeats", "1"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "error: the engine's CPU kernels could not be built here" in result.stderr
    assert "Traceback" not in result.stderr


def test_prefill_sized_matmuls_go_to_mkl_on_intel_cpus_only(kernel, monkeypatch):
    """Which rows take the kernel is the CPU vendor's rule (engine.cpu.ops.kernel_max_rows): on Intel,
    float32 inputs of more than 64 rows go to F.linear (MKL's sgemm is faster there); on AMD, and in
    bfloat16, every row count takes the kernel. Either way a Linear gives F.linear's numbers."""
    weight = torch.randn(48, 40)
    for vendor, expected in (("GenuineIntel", cpu_ops.MKL_MIN_ROWS - 1), ("AuthenticAMD", None), ("", None)):
        monkeypatch.setattr(cpu_ops, "_cpu_vendor", lambda vendor=vendor: vendor)
        assert cpu_ops.kernel_max_rows(weight) == (expected if torch.backends.mkl.is_available() else None)
        assert cpu_ops.kernel_max_rows(weight.bfloat16()) is None

    layer = Linear(40, 48, bias=True)
    layer.cpu_kernel, layer.packed_weight, layer.kernel_max_rows = True, cpu_ops.pack_weight(layer.weight.detach()), 4
    calls = []
    monkeypatch.setattr(cpu_ops, "small_batch_linear", lambda *a: calls.append(a[0].shape[0]) or kernel(*a))
    with torch.inference_mode():
        for rows in (1, 4, 5, 70):
            x = torch.randn(rows, 40)
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5, rtol=1e-5)
    assert calls == [1, 4]  # 5 and 70 rows went through F.linear


# Every ISA the engine ships a path for, whatever this machine has (the AVX2 build itself is compiled in
# full by the avx2_build fixture): (compiler, flags).
COMPILE_TARGETS = {
    "x86-64 baseline (SSE2 only: the generic build)": ("c++", "-march=x86-64"),
    "Sapphire Rapids (AVX-512, AVX512-BF16, AMX)": ("c++", "-march=sapphirerapids"),
    "aarch64 (NEON: the generic build)": ("aarch64-linux-gnu-g++", "-march=armv8-a"),
}


@pytest.mark.parametrize("target", list(COMPILE_TARGETS))
def test_the_kernels_compile_for_every_isa_they_have_a_path_for(target):
    """Most laptops have AVX2 and no AVX-512, most servers have AVX-512 (with AVX512-BF16 and AMX on
    Sapphire Rapids), old x86 and ARM take the generic build: the sources compile (syntax and templates,
    against torch's headers) for each, whatever this machine has, so each path is checked where another
    one runs. A helper defined only under ``#if defined(__AVX512F__)`` and used outside it, or a
    signature changed on one side only, fails here."""
    from torch.utils.cpp_extension import include_paths
    import sysconfig

    compiler, march = COMPILE_TARGETS[target]
    if not (sys.platform == "linux" and shutil.which(compiler)):
        pytest.skip(f"needs Linux and {compiler}" + (" (Debian: apt-get install g++-aarch64-linux-gnu)" if "aarch64" in compiler else ""))
    if compiler == "c++" and os.uname().machine != "x86_64":
        pytest.skip("this machine's c++ does not target x86-64")
    flags = [compiler, "-std=c++20", "-fsyntax-only", "-fopenmp", *march.split(),
             "-DTORCH_EXTENSION_NAME=syntax_check", "-DTORCH_API_INCLUDE_EXTENSION_H",
             *(f"-I{p}" for p in include_paths()), f"-I{sysconfig.get_paths()['include']}"]
    jobs = [subprocess.Popen([*flags, str(source)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for source in cpu_ops.SOURCES]
    for source, job in zip(cpu_ops.SOURCES, jobs):
        out, _ = job.communicate(timeout=600)
        assert job.returncode == 0, f"{source.name} for {target}:\n{out[-3000:]}"
