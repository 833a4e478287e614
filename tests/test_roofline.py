"""The roofline report (engine/tools/roofline.py): the bytes and FLOPs of a decode step, the machine's limits."""

from __future__ import annotations

import copy

import pytest
import torch

from engine import EngineConfig, LLMEngine
from engine.tools.roofline import (MachinePeaks, decode_report, decode_step_cost, format_prefill, format_report, measure_machine, model_cost,
                                   prefill_report, prefill_step_flops, roofline_ms)


@pytest.fixture(scope="module")
def tiny_model(tiny_llama_dir):
    return LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=16)).runner.model


def test_model_cost_counts_every_weight_once(tiny_model):
    # Tiny Llama: hidden 64, intermediate 128, 2 layers, 4 heads of 16, 2 KV heads, untied LM head.
    vocab = tiny_model.config.vocab_size
    per_layer = 64 * 64 + 2 * (32 * 64) + 64 * 64 + 3 * (128 * 64)  # q, k and v, o, gate/up/down
    cost = model_cost(tiny_model)
    assert cost.weight_macs_per_token == 2 * per_layer + vocab * 64  # the embedding lookup is no matmul
    assert cost.weight_bytes == 4 * (2 * per_layer + vocab * 64 + 2 * 2 * 64 + 64)  # fp32, + the 5 norms
    assert cost.kv_bytes_per_context_token == 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 KV heads, head_dim 16
    assert cost.attention_flops_per_context_token == 4 * 2 * 4 * 16
    nbytes, flops = decode_step_cost(cost, [10, 30])
    assert nbytes == cost.weight_bytes + 40 * cost.kv_bytes_per_context_token
    assert flops == 2 * 2 * cost.weight_macs_per_token + 40 * cost.attention_flops_per_context_token


def test_a_prefill_runs_every_token_through_the_layers_the_lm_head_once_per_prompt_and_attends_causally(tiny_model):
    cost = model_cost(tiny_model)
    vocab = tiny_model.config.vocab_size
    assert cost.lm_head_macs == vocab * 64
    layers = cost.weight_macs_per_token - cost.lm_head_macs
    # A 3-token prompt from scratch attends to 1 + 2 + 3 keys; a 2-token chunk after 4 cached tokens to 5 + 6.
    flops = prefill_step_flops(cost, [(3, 3), (2, 6)])
    assert flops == 2 * 5 * layers + 2 * 2 * cost.lm_head_macs + (6 + 11) * cost.attention_flops_per_context_token
    peaks = MachinePeaks(bandwidth_gb_s=10.0, matmul_gflop_s=100.0, threads=1, onednn_gflop_s=200.0)
    report = prefill_report(tiny_model, [(2.0, [(3, 3), (2, 6)]), (1.0, [(3, 3), (2, 6)])], peaks)
    best = report["best"]
    assert best is report["steps"][1] and best["tokens"] == 5 and best["requests"] == 2
    assert best["gflop_s"] == pytest.approx(flops / 1e6)  # FLOPs in 1 ms
    assert best["share"] == pytest.approx(flops / 1e6 / 100.0) and best["tight_share"] == pytest.approx(flops / 1e6 / 200.0)
    line = format_prefill(report, vars(peaks))
    assert line.startswith("prefill step of 2 prompts (5 tokens,") and f"{100 * best['share']:.0f}% of the torch.mm peak (100 GFLOP/s)" in line
    assert prefill_report(tiny_model, [], peaks)["best"] is None and format_prefill({"best": None}, vars(peaks)) == ""


def test_roofline_is_the_larger_of_the_two_times(tiny_model):
    peaks = MachinePeaks(bandwidth_gb_s=10.0, matmul_gflop_s=100.0, threads=2)
    assert roofline_ms(10**9, 10**9, peaks) == pytest.approx(100.0)  # 1 GB at 10 GB/s: memory-bound
    assert roofline_ms(10**6, 10**12, peaks) == pytest.approx(10_000.0)  # 1 TFLOP at 100 GFLOP/s
    report = decode_report(tiny_model, [(2.0, [5]), (4.0, [5, 7, 9])], peaks)
    first, second = report["steps"]
    assert (first["batch"], second["batch"]) == (1, 3) and first["bound"] == second["bound"] == "memory"
    cost = model_cost(tiny_model)
    assert first["roofline_ms"] == pytest.approx(1e3 * (cost.weight_bytes + 5 * cost.kv_bytes_per_context_token) / 10e9)
    assert report["mean_share"] == pytest.approx((first["roofline_ms"] / 2.0 + second["roofline_ms"] / 4.0) / 2)
    assert report["total_share"] == pytest.approx((first["roofline_ms"] + second["roofline_ms"]) / 6.0)
    assert report["mean_share_by_bound"] == {"memory": pytest.approx(report["mean_share"])}  # no compute-bound step
    mixed = decode_report(tiny_model, [(2.0, [5]), (3e4, [5] * 3000)], peaks)  # 3,000 rows: compute-bound
    assert [s["bound"] for s in mixed["steps"]] == ["memory", "compute"]
    assert mixed["mean_share_by_bound"] == {"memory": pytest.approx(mixed["steps"][0]["share"]),
                                            "compute": pytest.approx(mixed["steps"][1]["share"])}
    assert "1 compute-bound at " in format_report(mixed) and "1 memory-bound at " in format_report(mixed)
    text = format_report(report)
    cell = f"1: 2.0/{first['roofline_ms']:.1f} ({100 * first['roofline_ms'] / 2.0:.0f}%)"
    assert "10.0 GB/s" in text and cell in text and "over 2 decode steps" in text
    assert "no decode steps" in format_report(decode_report(tiny_model, [], peaks))
    assert report["mean_tight_share"] is None and all(s["tight_share"] == s["share"] for s in report["steps"])  # not measured
    assert "read-only" not in text and "oneDNN" not in text and "tighter" not in text


def test_the_tighter_roofline_takes_the_faster_of_each_pair_of_measurements(tiny_model):
    steps = [(2.0, [5]), (3e4, [5] * 3000)]  # memory-bound, compute-bound
    copy_mm = MachinePeaks(10.0, 100.0, 2)
    faster = decode_report(tiny_model, steps, MachinePeaks(10.0, 100.0, 2, read_gb_s=40.0, onednn_gflop_s=200.0))
    memory, compute = faster["steps"]
    assert memory["roofline_ms"] == pytest.approx(roofline_ms(*decode_step_cost(model_cost(tiny_model), [5]), copy_mm))  # the headline: as before
    assert memory["tight_share"] == pytest.approx(memory["share"] / 4)  # 4x the bandwidth: a quarter of the time
    assert compute["tight_share"] == pytest.approx(compute["share"] / 2)  # 2x the peak: half
    assert faster["mean_tight_share"] == pytest.approx((memory["tight_share"] + compute["tight_share"]) / 2)
    text = format_report(faster)
    assert "40.0 GB/s read-only" in text and "200 through oneDNN" in text
    assert f"(40.0 GB/s, 200 GFLOP/s): mean share {100 * faster['mean_tight_share']:.0f}%" in text
    # Each second measurement slower than the first: the first bounds (the tighter roofline is the same).
    slower = decode_report(tiny_model, steps, MachinePeaks(10.0, 100.0, 2, read_gb_s=5.0, onednn_gflop_s=50.0))
    assert [s["tight_share"] for s in slower["steps"]] == pytest.approx([s["share"] for s in slower["steps"]])
    assert "(10.0 GB/s, 100 GFLOP/s)" in format_report(slower)
    only_read = decode_report(tiny_model, steps, MachinePeaks(10.0, 100.0, 2, read_gb_s=40.0))  # no oneDNN here
    assert only_read["steps"][1]["tight_share"] == pytest.approx(only_read["steps"][1]["share"])
    assert "oneDNN" not in format_report(only_read) and "(40.0 GB/s, 100 GFLOP/s)" in format_report(only_read)


def test_machine_measurement_gives_plausible_limits():
    peaks = measure_machine(copy_mb=32, matmul_n=256, repeats=2)
    assert 0.1 < peaks.bandwidth_gb_s < 10_000 and 0.1 < peaks.matmul_gflop_s < 1e6 and peaks.threads >= 1
    assert 0.1 < peaks.read_gb_s < 10_000
    assert peaks.onednn_gflop_s is None or 0.1 < peaks.onednn_gflop_s < 1e6
    assert (peaks.onednn_gflop_s is None) == (not torch.backends.mkldnn.is_available())
    assert peaks.dtype == "float32"
    with pytest.raises(ValueError, match="repeats"):
        measure_machine(repeats=0)
    with pytest.raises(ValueError, match="dtype"):
        measure_machine(copy_mb=1, matmul_n=8, repeats=1, dtype=torch.float16)


def test_the_matmul_peak_is_measured_in_the_models_dtype(tiny_model):
    bf16 = measure_machine(copy_mb=8, matmul_n=128, repeats=1, dtype=torch.bfloat16)
    assert bf16.dtype == "bfloat16" and 0.1 < bf16.matmul_gflop_s < 1e6
    steps = [(2.0, [5])]
    # A float32 peak is no bound for bf16 arithmetic (AVX512-BF16 does twice fp32's multiply-adds), nor the reverse.
    with pytest.raises(ValueError, match="measured in bfloat16 but the model computes in float32"):
        decode_report(tiny_model, steps, bf16)
    model16 = copy.deepcopy(tiny_model).to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"measured in float32 but the model computes in bfloat16: measure_machine\(dtype=torch.bfloat16\)"):
        decode_report(model16, steps, MachinePeaks(10.0, 100.0, 2))
    report = decode_report(model16, steps, MachinePeaks(10.0, 100.0, 2, dtype="bfloat16"))
    assert "(torch.mm; bfloat16, 2 threads)" in format_report(report)
    assert "(torch.mm; float32, 2 threads)" in format_report(decode_report(tiny_model, steps, MachinePeaks(10.0, 100.0, 2)))
