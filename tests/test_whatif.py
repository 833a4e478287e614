"""What-ifs at production scale (engine/sim/whatif.py): the formulas, the paper's Table 1, the simulator's bars."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.config import kv_bytes_per_slot
from engine.sim.whatif import GPUS, MODELS, WhatIfConfig, slots_per_request, what_if

PAPER_SLOTS = 15_700  # PagedAttention Table 1: OPT-13B on one A100-40GB, 12 GB of KV


def test_llama_3_8b_kv_bytes_per_token_is_the_formula():
    result = what_if(WhatIfConfig(model="llama-3-8b", dtype="bfloat16"), simulate_throughput=False)
    assert result.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert result.weight_bytes == pytest.approx(8.03e9 * 2)


def test_opt_13b_on_an_a100_40gb_leaves_the_papers_slots():
    result = what_if(WhatIfConfig("opt-13b", "a100-40gb", "float16", 2048, 1, 161, 338), simulate_throughput=False)
    assert abs(result.kv_slots / PAPER_SLOTS - 1) < 0.05
    assert result.kv_memory_bytes / 2**30 == pytest.approx(12, abs=0.6)  # "12 GB" of KV
    assert result.ridge_batch == pytest.approx(200, abs=2)  # cost_model.py: "about 200 tokens on an A100"


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
    assert max_.batch == max_.requests_fit < result.ridge_batch  # contiguous Max: memory-bound, KV-starved
    assert paged.sim_requests_per_s > 1.5 * max_.sim_requests_per_s
    assert paged.sim_mean_running > 3 * max_.sim_mean_running


def test_a_model_too_large_for_the_gpu_says_so():
    result = what_if(WhatIfConfig(model="llama-3-70b", gpu="a100-40gb", max_model_len=2048))
    assert not result.fits and result.kv_slots == 0
    assert all(s.requests_fit == 0 and s.sim_requests_per_s == 0 for s in result.systems)


@pytest.mark.parametrize("kwargs, field", [
    (dict(model="gpt-5"), "model"), (dict(gpu="tpu"), "gpu"), (dict(dtype="int3"), "dtype"),
    (dict(prompt_len=4000, output_len=200), "max_model_len"), (dict(block_size=0), "block_size"),
    (dict(model="opt-13b", max_model_len=4096), "positions"), (dict(gpu_memory_utilization=1.5), "gpu_memory_utilization"),
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
