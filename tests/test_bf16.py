"""bfloat16 on CPU: tiny random Llama, Qwen2 and Qwen3 against transformers in bfloat16.

In bfloat16 two implementations that add in another order round differently (8 significant bits:
one step is 1/256 of a logit's magnitude), so greedy tokens may part where two logits are that close.
Each test asserts the tokens are the same or, at the first difference, that transformers itself
ranks the engine's token within two bfloat16 steps of its own top: a near-tie. Any real bug (a wrong
position, a wrong block, a wrong head) picks tokens far below the top.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers

from conftest import make_tiny_model
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.cpu import ops as cpu_ops
from engine.model_executor.model_runner import CPU_KERNEL_BACKEND, TORCH_BACKEND
from test_engine import hf_greedy, random_prompts, run_engine


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny_bf16(request, tmp_path_factory, default_model_dir):
    # Weights 5x the default init: logits of a few units, so that most steps are no near-tie.
    directory = make_tiny_model(tmp_path_factory.mktemp(request.param), request.param, default_model_dir, seed=1, initializer_range=0.1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).eval()
    return directory, hf


def bf16_step(x: float) -> float:
    """The distance between two neighbouring bfloat16 values around x."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0**-133


@torch.inference_mode()
def assert_same_or_near_tie(hf, prompt: list[int], ours: list[int], theirs: list[int]) -> int:
    """Returns the number of tokens that agree (all of them, or up to a near-tie)."""
    if ours == theirs:
        return len(ours)
    pos = next(j for j, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    logits = hf(torch.tensor([prompt + theirs[:pos]])).logits[0, -1].float()
    top = float(logits.max())
    gap = top - float(logits[ours[pos]])
    assert gap <= 2 * bf16_step(top), f"token {pos}: the engine's token is {gap:.4g} below transformers' top ({top:.4g}): no near-tie"
    return pos


def test_tiny_models_in_bf16_match_transformers_in_bf16(tiny_bf16):
    directory, hf = tiny_bf16
    engine = LLMEngine(EngineConfig(model=str(directory), dtype="bfloat16", num_gpu_blocks=64))
    assert engine.dtype == torch.bfloat16 and engine.runner.kv_caches[0][0].dtype == torch.bfloat16
    assert engine.runner.backend is CPU_KERNEL_BACKEND
    matmul = engine.runner.model.model.layers[0].mlp.up_proj.cpu_kernel
    assert matmul == cpu_ops.matmul_bf16()  # where the CPU has AVX512-BF16
    assert engine.cpu_backend.split(";")[0] == (
        "engine CPU kernels (matmul, RMSNorm, RoPE, SiLU-and-mul, decode attention)" if matmul
        else "engine CPU kernels (RMSNorm, RoPE, SiLU-and-mul, decode attention), torch matmul (no AVX512-BF16)"
    )
    prompts = random_prompts(hf.config.vocab_size, [5, 17, 33, 2, 60])
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    theirs = [hf_greedy(hf, p, 16, eos=None) for p in prompts]
    for backend in (CPU_KERNEL_BACKEND, TORCH_BACKEND):  # decode attention: the kernel, then the torch reference
        engine.runner.backend = backend
        ours, _ = run_engine(engine, prompts, params)
        agreed = [assert_same_or_near_tie(hf, p, o, t) for p, o, t in zip(prompts, ours, theirs)]
        assert sum(agreed) >= 0.75 * 16 * len(prompts), agreed  # near-ties are rare, not the rule


def test_fp32_agreement_counts_tokens_up_to_the_first_difference(tiny_llama_dir):
    from engine.llm import LLM
    from engine.tools.precision import fp32_agreement

    prompts = random_prompts(49152, [4, 9], seed=2)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (6, 8)]
    fp32 = [o.token_ids for o in LLM(str(tiny_llama_dir), num_gpu_blocks=32).generate(prompts, params)]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    same = fp32_agreement(str(tiny_llama_dir), prompts, params, fp32, hf, num_gpu_blocks=32)
    assert same == {"tokens": 14, "agreeing_tokens": 14, "agreement": 1.0, "identical_requests": 2, "divergences": []}
    changed = [fp32[0], fp32[1][:3] + [(fp32[1][3] + 1) % 49152] + fp32[1][4:]]  # request 1 parts at token 3
    report = fp32_agreement(str(tiny_llama_dir), prompts, params, changed, hf, num_gpu_blocks=32)
    assert report["agreeing_tokens"] == 6 + 3 and report["identical_requests"] == 1
    (d,) = report["divergences"]
    assert d["request"] == 1 and d["position"] == 3 and d["fp32_top2_margin"] > 0


def test_bench_in_bf16_reports_the_agreement_with_fp32(tiny_llama_dir):
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "engine", "bench", "--model", str(tiny_llama_dir), "--num-prompts", "3",
           "--min-tokens", "2", "--max-tokens", "6", "--repeats", "1", "--dtype", "bfloat16"]
    result = subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)
    assert data["dtype"] == "bfloat16" and "RMSNorm, RoPE" in data["engine_cpu_backend"]
    agreement = data["fp32_agreement"]
    assert agreement["tokens"] == 2 + 4 + 6 and 0 <= agreement["agreement"] <= 1
    assert len(agreement["divergences"]) == 3 - agreement["identical_requests"]
    assert data["roofline"]["peaks"]["dtype"] == "bfloat16"  # the matmul peak in the model's dtype, not fp32's
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert text.returncode == 0 and "bfloat16 vs float32 greedy tokens" in text.stdout and "mean share of the roofline" in text.stdout
    assert "; bfloat16, " in text.stdout  # the roofline line names the peak's dtype
