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
from engine.model_runner import CPU_KERNEL_BACKEND, TORCH_BACKEND
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
    assert engine.cpu_backend == "engine CPU kernel for decode attention, torch for the rest (bfloat16)"
    prompts = random_prompts(hf.config.vocab_size, [5, 17, 33, 2, 60])
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    theirs = [hf_greedy(hf, p, 16, eos=None) for p in prompts]
    for backend in (CPU_KERNEL_BACKEND, TORCH_BACKEND):  # decode attention: the kernel, then the torch reference
        engine.runner.backend = backend
        ours, _ = run_engine(engine, prompts, params)
        agreed = [assert_same_or_near_tie(hf, p, o, t) for p, o, t in zip(prompts, ours, theirs)]
        assert sum(agreed) >= 0.75 * 16 * len(prompts), agreed  # near-ties are rare, not the rule
