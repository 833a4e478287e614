"""What-ifs at production scale (engine/sim/whatif.py): the formulas, the paper's Table 1, the simulator's bars,
tensor parallelism and quantized weights, and a ridge point that counts each request's KV reads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.config import kv_bytes_per_slot
from engine.sim.whatif import GIB, GPUS, MODELS, WhatIfConfig, cost_model_of, slots_per_request, what_if

PAPER_SLOTS = 15_700  # PagedAttention Table 1: OPT-13B on one A100-40GB, 12 GB of KV


def test_llama_3_8b_kv_bytes_per_token_is_the_formula():
    result = what_if(WhatIfConfig(model="llama-3-8b", dtype="bfloat16"), simulate_throughput=False)
    assert result.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert result.weight_bytes == pytest.approx(8.03e9 * 2)


def test_opt_13b_on_an_a100_40gb_leaves_the_papers_slots():
    result = what_if(WhatIfConfig("opt-13b", "a100-40gb", "float16", 2048, 1, 161, 338), simulate_throughput=False)
    assert abs(result.kv_slots / PAPER_SLOTS - 1) < 0.05
    assert result.kv_memory_bytes / 2**30 == pytest.approx(12, abs=0.6)  # "12 GB" of KV
    cost = cost_model_of(result.model, result.gpu, "float16")
    assert cost.weights_s / cost.token_s == pytest.approx(200, abs=2)  # cost_model.py: the linear layers alone, "about 200"
    # ... but each request also reads its KV: at 330 tokens of context 800 KiB a token, longer than its compute.
    assert result.ridge["kv_s"] > result.ridge["compute_s"] and result.ridge_batch is None


def test_every_catalogue_entry_gives_its_kv_formula():
    for model in MODELS.values():
        cfg = WhatIfConfig(model=model.key, gpu="h200", max_model_len=2048)
        result = what_if(cfg, simulate_throughput=False)
        assert result.kv_bytes_per_token == kv_bytes_per_slot(model.num_layers, model.num_kv_heads, model.head_dim, 2)
        assert model.source.startswith("https://huggingface.co/")
    assert all(g.source for g in GPUS.values())


def test_reservations_follow_the_papers_rules():
    cfg = WhatIfConfig(max_model_len=4096, prompt_len=500, output_len=300, block_size=16)
    assert slots_per_request("paged", cfg) == 800  # 800 tokens = 50 whole blocks
    assert slots_per_request("oracle", cfg) == 800
    assert slots_per_request("pow2", cfg) == 500 + 512  # the output rounded up to a power of two
    assert slots_per_request("max", cfg) == 4096
    cfg = WhatIfConfig(max_model_len=4096, prompt_len=500, output_len=301, block_size=16)
    assert slots_per_request("paged", cfg) == 816  # the last block part-filled


def test_more_requests_fit_paged_and_the_simulator_serves_them_faster_than_max():
    result = what_if(WhatIfConfig("llama-3-8b", "h100", "bfloat16", 8192, 1000, 512, 300))
    paged, max_ = result.system("paged"), result.system("max")
    assert paged.requests_fit == result.kv_slots // 816 and max_.requests_fit == result.kv_slots // 8192
    assert max_.batch == max_.requests_fit < paged.batch  # contiguous Max: KV-starved
    assert paged.sim_requests_per_s > 1.5 * max_.sim_requests_per_s
    assert paged.sim_mean_running > 3 * max_.sim_mean_running


def test_a_model_too_large_for_the_gpu_says_so_and_what_would_fit():
    result = what_if(WhatIfConfig(model="llama-3-70b", gpu="a100-40gb", max_model_len=2048))
    assert not result.fits and result.kv_slots == 0
    assert all(s.requests_fit == 0 and s.sim_requests_per_s == 0 for s in result.systems)
    one = WhatIfConfig("llama-3-70b", "h100", "float16", 2048)
    result = what_if(one)
    assert result.kv_memory_bytes / GIB == pytest.approx(-59.82, abs=0.01)  # the weights alone exceed 0.9 x 79.6 GiB
    # The nearest choices that fit: two H100s, or fp8 weights; no single GPU of the catalogue holds 131.5 GiB.
    assert result.would_fit == {"tensor_parallel_size": 2, "weight_dtype": "fp8"}
    assert what_if(WhatIfConfig("llama-3-70b", "h100", "float16", 2048, tensor_parallel_size=2), simulate_throughput=False).fits
    assert not what_if(WhatIfConfig("llama-3-70b", "h200", "float16", 2048), simulate_throughput=False).fits


def test_llama_3_70b_on_8_h100s_splits_weights_and_kv_heads():
    """By hand: 0.9 x 79.6 GiB - 141.2 GB / 8 per GPU, / (2 x 80 layers x 1 KV head x 128 x 2 B) = 1.45 M slots."""
    cfg = WhatIfConfig("llama-3-70b", "h100", "float16", 2048, 1000, 512, 256, tensor_parallel_size=8)
    result = what_if(cfg)
    per_gpu = 0.9 * GPUS["h100"].memory_bytes - 70.6e9 * 2 / 8
    assert result.kv_bytes_per_token_per_gpu == 2 * 80 * 1 * 128 * 2 and result.kv_bytes_per_token == 327_680
    assert result.kv_slots == int(per_gpu // 40_960) == 1_448_211
    assert result.kv_memory_bytes == pytest.approx(8 * per_gpu) and result.fits
    assert result.system("paged").requests_fit == result.kv_slots // 768 == 1_885
    one = cost_model_of(MODELS["llama-3-70b"], GPUS["h100"], "float16")
    eight = cost_model_of(MODELS["llama-3-70b"], GPUS["h100"], "float16", tensor_parallel_size=8)
    assert eight.weights_s == pytest.approx(one.weights_s / 8) and eight.kv_token_s == pytest.approx(one.kv_token_s / 8)
    assert result.system("paged").sim_requests_per_s > 0
    # int4 weights (half a byte each) fit on one H100; fp8 needs the matmuls' dtype only for compute.
    int4 = what_if(WhatIfConfig("llama-3-70b", "h100", "float16", 2048, weight_dtype="int4"), simulate_throughput=False)
    assert int4.weight_bytes == pytest.approx(70.6e9 / 2) and int4.fits
    with pytest.raises(ValueError, match="tensor_parallel_size=2: SmolLM2-135M's 9 attention heads"):
        WhatIfConfig(model="smollm2-135m", max_model_len=2048, tensor_parallel_size=2)


@pytest.mark.parametrize("prompt_len, output_len", [(512, 256), (64, 64)])
def test_the_ridge_point_counts_each_requests_kv_and_is_where_the_curve_turns_compute_bound(prompt_len, output_len):
    """Llama-3-8B on an H100: at 640 tokens of mean context a request's KV reads (30.8 us a step) outlast its
    compute (16.6 us), so no batch is compute-bound; at 96 tokens they do not, and the step turns
    compute-bound at one batch, the same on the page's curve."""
    result = what_if(WhatIfConfig(prompt_len=prompt_len, output_len=output_len), simulate_throughput=False)
    ridge, curve = result.ridge_batch, result.decode_curve
    if prompt_len == 512:
        assert ridge is None and all(r["memory_ms"] > r["compute_ms"] for r in curve)
        return
    assert ridge == 411 and ridge in [r["batch"] for r in curve]
    assert all((r["compute_ms"] >= r["memory_ms"]) == (r["batch"] >= ridge) for r in curve)
    roof = 1 / result.ridge["compute_s"]  # compute-bound: tokens/s nears one request's compute, whatever the batch
    assert all(r["tokens_per_s"] < roof for r in curve) and curve[-1]["tokens_per_s"] > 0.95 * roof


@pytest.mark.parametrize("kwargs, field", [
    (dict(model="gpt-5"), "model"), (dict(gpu="tpu"), "gpu"), (dict(dtype="int3"), "dtype"),
    (dict(prompt_len=4000, output_len=200), "max_model_len"), (dict(block_size=0), "block_size"),
    (dict(model="opt-13b", max_model_len=4096), "positions"), (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
    (dict(weight_dtype="int3"), "weight_dtype"), (dict(tensor_parallel_size=0), "tensor_parallel_size"),
    (dict(tensor_parallel_size=3), "tensor_parallel_size=3"),
])
def test_bad_settings_name_their_cause(kwargs, field):
    with pytest.raises(ValueError, match=field):
        WhatIfConfig(**kwargs)


def test_whatif_cli_prints_the_same_figures():
    out = subprocess.run([sys.executable, "-m", "engine", "whatif", "--model", "opt-13b", "--gpu", "a100-40gb", "--dtype", "float16",
                          "--max-model-len", "2048", "--prompt-len", "161", "--output-len", "338", "--num-users", "100"],
                         capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    assert data["kv_bytes_per_token"] == 2 * 40 * 40 * 128 * 2
    assert abs(data["kv_slots"] / PAPER_SLOTS - 1) < 0.05
    assert {s["system"] for s in data["systems"]} == {"paged", "max", "pow2", "oracle"}


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("tp", [1, 8])
def test_the_pages_memory_formula_is_in_gib_and_adds_up(lang, tp):
    """What a student copies: utilization x memory - weights = KV memory, every size in GiB."""
    import re

    from app_pages.whatif import formulas

    result = what_if(WhatIfConfig("llama-3-70b" if tp == 8 else "llama-2-13b", "h100" if tp == 8 else "a100-40gb", "float16", 4096,
                                  tensor_parallel_size=tp), simulate_throughput=False)
    memory = formulas(result, lang)["memory"]
    assert "GB " not in memory + " " and memory.count("GiB") == 3, memory
    util, total, weights, kv = (float(x.replace(",", "")) for x in re.findall(r"(\d[\d,]*\.?\d*)(?= ×| GiB)", memory)[-4:])
    assert tp * (util * total - weights) == pytest.approx(kv, abs=0.01 * tp), memory
    if tp == 1:  # Llama-2-13B on an A100-40GB: 0.9 x 40.0 GiB - 24.21 GiB = 11.79 GiB
        assert (util, total, weights, kv) == (0.9, 40.0, 24.21, 11.79)
    assert f"{result.weight_bytes / GIB:,.2f} GiB" in formulas(result, lang)["weights"]


def test_the_page_says_what_its_defaults_hide():
    """Llama-2-13B on an A100-40GB: an output of 256 makes Pow2 reserve what Oracle does, and paged beats Oracle
    only by admitting more than fit and preempting; the page says both, and neither where it does not hold."""
    from app_pages.whatif import notes

    result = what_if(WhatIfConfig("llama-2-13b", "a100-40gb", "float16", 4096, 1000, 512, 256))
    paged, oracle = result.system("paged"), result.system("oracle")
    assert result.system("pow2").requests_fit == oracle.requests_fit
    assert paged.sim_requests_per_s > oracle.sim_requests_per_s and paged.sim_preemptions > 0
    said = notes(result, "en")
    assert len(said) == 2 and "power of two" in said[0] and f"preempts ({paged.sim_preemptions} times" in said[1]
    other = what_if(WhatIfConfig("llama-2-13b", "a100-40gb", "float16", 4096, 1, 512, 200))
    assert notes(other, "zh") == []
