"""Speculative decoding on the real engine: the early-exit drafter against transformers, greedy
output identical with and without speculation, and the same as transformers' assisted generation."""

from __future__ import annotations

import pytest
import torch
import transformers

from conftest import make_tiny_model
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.spec_decode.draft_layers import EarlyExitDrafter


@pytest.fixture(scope="module")
def deep_tiny(tmp_path_factory, default_model_dir):
    """A 4-layer tiny random Llama (early exit needs layers to leave out), float64 in both."""
    directory = make_tiny_model(tmp_path_factory.mktemp("tiny-llama-4"), "llama", default_model_dir, seed=2, num_hidden_layers=4)
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float64).eval()
    return directory, hf


def hf_early_exit_greedy(hf, ids: list[int], num_layers: int, k: int) -> list[int]:
    """k greedy tokens from the first ``num_layers`` layers, the final norm and the LM head, as
    transformers' EarlyExitCandidateGenerator runs them (``config.num_hidden_layers`` lowered)."""
    full = hf.config.num_hidden_layers
    hf.config.num_hidden_layers = num_layers
    try:
        out = []
        with torch.inference_mode():
            for _ in range(k):
                token = int(hf(torch.tensor([ids + out])).logits[0, -1].argmax())
                out.append(token)
        return out
    finally:
        hf.config.num_hidden_layers = full


@pytest.mark.parametrize("num_layers", [1, 3])
def test_early_exit_drafts_equal_transformers(deep_tiny, num_layers):
    directory, hf = deep_tiny
    engine = LLMEngine(EngineConfig(model=str(directory), dtype="float64", block_size=4, num_gpu_blocks=32))
    prompt = torch.randint(3, hf.config.vocab_size, (9,), generator=torch.Generator().manual_seed(num_layers)).tolist()
    rid = engine.add_request(prompt, SamplingParams(max_tokens=20, ignore_eos=True))
    engine.step()  # the prefill: the prompt's KV in the pool, the first token sampled
    seq = engine.requests[rid]
    k = 5
    engine.kv.append_slot(seq)
    assert engine.kv.allocate_lookahead_slots(seq, k) == k
    drafter = EarlyExitDrafter(engine.runner.model, num_layers, engine.runner.backend)
    drafts = drafter.propose([seq], [k], engine.kv, engine.runner.caches_for(engine.kv.attention_block_size))
    assert drafts == [hf_early_exit_greedy(hf, seq.token_ids, num_layers, k)]
