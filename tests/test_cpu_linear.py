"""The engine's CPU small-batch matmul kernel (engine/csrc/small_batch_linear.cpp), built for real."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.nn import functional as F

from engine import EngineConfig, LLMEngine, SamplingParams, cpu_linear
from engine.model import Linear


@pytest.fixture(scope="module")
def kernel():
    assert cpu_linear.load_kernel(), f"the kernel did not build here: {cpu_linear.kernel_error()}"
    return cpu_linear.small_batch_linear


def _errors(x: torch.Tensor, weight_kn: torch.Tensor, ours: torch.Tensor) -> tuple[float, float]:
    """Largest error of ours and of torch's F.linear against the float64 product."""
    exact = x.double() @ weight_kn.double()
    theirs = F.linear(x, weight_kn.t())
    return float((ours.double() - exact).abs().max()), float((theirs.double() - exact).abs().max())


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 40),
    k=st.integers(1, 700),
    tiles=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
)
def test_kernel_matches_the_exact_product(kernel, rows, k, tiles, seed):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=generator)
    weight_kn = torch.randn(k, 64 * tiles, generator=generator)
    ours = kernel(x, weight_kn)
    assert ours.shape == (rows, 64 * tiles) and ours.dtype == torch.float32
    ours_error, torch_error = _errors(x, weight_kn, ours)
    # Blocked sums keep the rounding error of the order of a blocked GEMM's (MKL's), never far above it.
    assert ours_error <= 4 * torch_error + 1e-5 * k**0.5


def test_kernel_reads_strided_inputs_and_model_sized_shapes(kernel):
    x = torch.randn(16, 2 * 576)[:, ::2]  # a non-contiguous view: copied once, then multiplied
    for n in (192, 576, 1536, 49152):
        weight_kn = torch.randn(576, n)
        ours_error, torch_error = _errors(x, weight_kn, kernel(x, weight_kn))
        assert ours_error <= 4 * torch_error + 1e-4


@pytest.mark.parametrize(
    "x, weight_kn, message",
    [
        (torch.randn(4, 8), torch.randn(8, 96), "multiple of 64"),
        (torch.randn(4, 8, dtype=torch.float64), torch.randn(8, 64, dtype=torch.float64), "float32 only"),
        (torch.randn(4, 9), torch.randn(8, 64), r"\[M, 9\]"),
        (torch.randn(4, 8), torch.randn(64, 8).t(), "contiguous"),
        (torch.randn(2, 4, 8), torch.randn(8, 64), "2-D"),
    ],
)
def test_kernel_refuses_what_it_cannot_multiply(kernel, x, weight_kn, message):
    with pytest.raises(RuntimeError, match=message):
        kernel(x, weight_kn)
    assert not cpu_linear.supports(weight_kn) or x.dim() != 2 or x.shape[1] != weight_kn.shape[0] or x.dtype != weight_kn.dtype
    ok = kernel(torch.ones(2, 8), torch.ones(8, 64))  # still usable afterwards
    assert torch.equal(ok, torch.full((2, 64), 8.0))


def test_linear_module_uses_the_kernel_only_for_small_batches(kernel):
    torch.manual_seed(0)
    module = Linear(96, 128, bias=True)
    reference = Linear(96, 128, bias=True)
    reference.load_state_dict(module.state_dict())
    weight_kn = module.weight.detach().t().contiguous()
    module.weight = torch.nn.Parameter(weight_kn.t(), requires_grad=False)
    module.weight_kn = weight_kn
    assert set(module.state_dict()) == {"weight", "bias"}  # checkpoints load by the same names
    with torch.inference_mode():
        for rows in (1, 7, cpu_linear.MAX_ROWS):
            x = torch.randn(rows, 96)
            torch.testing.assert_close(module(x), reference(x), atol=1e-5, rtol=1e-5)
        x = torch.randn(cpu_linear.MAX_ROWS + 1, 96)  # a prefill-sized batch: torch's F.linear, exactly
        assert torch.equal(module(x), F.linear(x, weight_kn.t(), module.bias))


def test_engine_gives_the_same_tokens_with_and_without_the_kernel(tiny_llama_dir, kernel):
    prompts = ["The block table maps", [{"role": "user", "content": "Hi!"}], "Paged attention"]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    outputs = {}
    for flag in (True, False):
        engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), small_batch_kernel=flag, num_gpu_blocks=64))
        assert engine.linear_backend == ("engine small-batch kernel" if flag else "torch F.linear")
        mlp = engine.runner.model.model.layers[0].mlp
        assert (mlp.up_proj.weight_kn is not None) == flag  # intermediate 128: two 64-column tiles
        ids = [engine.add_request(p, params) for p in prompts]
        while engine.has_unfinished_requests():
            engine.step()
        outputs[flag] = [engine.get_output(i).token_ids for i in ids]
    assert outputs[True] == outputs[False]


def test_small_batch_kernel_setting_is_checked():
    with pytest.raises(ValueError, match="small_batch_kernel"):
        EngineConfig(small_batch_kernel="yes")


def test_a_failed_build_warns_and_falls_back_to_torch(tmp_path, tiny_llama_dir):
    # A real failed build: no compiler where torch.utils.cpp_extension looks for one (CXX).
    script = textwrap.dedent(
        f"""
        import warnings
        from engine import EngineConfig, LLMEngine, SamplingParams, cpu_linear
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert cpu_linear.load_kernel({str(tmp_path / "build")!r}) is False
        messages = [str(w.message) for w in caught if "could not be built" in str(w.message)]
        assert len(messages) == 1, [str(w.message) for w in caught]
        assert "no-such-compiler" in messages[0][-300:], messages[0]  # the compiler's own words, at the end
        print("error:", cpu_linear.kernel_error()[:200])
        engine = LLMEngine(EngineConfig(model={str(tiny_llama_dir)!r}))
        assert engine.linear_backend == "torch F.linear"
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


def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_start(tmp_path):
    # torch waits for the build directory's lock file; a killed build leaves it behind.
    script = textwrap.dedent(
        f"""
        import os, time
        from pathlib import Path
        from engine import cpu_linear
        from engine.cpu_linear import _build_and_load
        root = Path({str(tmp_path)!r})
        # Where this machine's build goes: the same fingerprint directory load_kernel uses.
        real_mkdir = Path.mkdir
        def mkdir_with_stale_lock(self, *args, **kwargs):
            real_mkdir(self, *args, **kwargs)
            if self.parent == root:
                lock = self / "lock"
                lock.touch()
                old = time.time() - 2 * cpu_linear.STALE_LOCK_S
                os.utime(lock, (old, old))
        Path.mkdir = mkdir_with_stale_lock
        assert cpu_linear.load_kernel(root), cpu_linear.kernel_error()
        print("built")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "built" in result.stdout
    assert "Building the engine's CPU matmul kernel" in result.stderr  # a first build says so
