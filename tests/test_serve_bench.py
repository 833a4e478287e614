"""`python -m engine bench-serve` against the lab's own server (a tiny random model): every request
is counted, its tokens are the ones asked for, and the latency figures hang together."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from engine import EngineConfig, LLMEngine
from engine.cli import main
from engine.tools.bench_serve import arrival_gaps, random_dataset
from test_serve import metrics, serving


def test_random_dataset_and_poisson_arrivals_follow_their_parameters():
    requests = random_dataset(200, input_len=40, output_len=10, range_ratio=0.5, vocab_size=1000, seed=3)
    assert all(20 <= len(r.prompt_token_ids) <= 60 and 5 <= r.output_len <= 15 for r in requests)
    assert all(0 <= t < 1000 for r in requests for t in r.prompt_token_ids)
    assert random_dataset(5, 8, 4, 0.0, 1000, 3)[0].prompt_token_ids == random_dataset(5, 8, 4, 0.0, 1000, 3)[0].prompt_token_ids
    gaps = np.array(arrival_gaps(20000, request_rate=4.0, burstiness=1.0, seed=0))
    assert abs(gaps.mean() - 0.25) < 0.01 and abs(gaps.std() - 0.25) < 0.01  # exponential: std = mean
    assert np.array(arrival_gaps(20000, 4.0, 4.0, 0)).std() < 0.15  # burstiness > 1: more regular
    assert arrival_gaps(3, math.inf, 1.0, 0) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("flags", [["--request-rate", "40"], ["--max-concurrency", "3"]])
def test_bench_serve_measures_every_request(tiny_llama_dir, capsys, flags):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=64))
    with serving(engine) as (base, _):
        main(["bench-serve", "--base-url", base, "--num-prompts", "12", "--random-input-len", "24", "--random-output-len", "8",
              "--random-range-ratio", "0.5", "--json", *flags])
        result = json.loads(capsys.readouterr().out)
        served = metrics(base)
    assert result["completed"] == 12 and result["failed"] == 0
    assert result["total_output_tokens"] == served["vllm:generation_tokens_total"]
    assert result["total_input_tokens"] == served["vllm:prompt_tokens_total"]
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < result[f"p50_{name}_ms"] <= result[f"p90_{name}_ms"] <= result[f"p99_{name}_ms"]
    assert result["p50_ttft_ms"] < result["p50_e2el_ms"]
    assert result["output_throughput"] == pytest.approx(result["total_output_tokens"] / result["duration"])


def test_bench_serve_prints_vllms_report(tiny_llama_dir, capsys):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=64))
    with serving(engine) as (base, _):
        main(["bench-serve", "--base-url", base, "--num-prompts", "4", "--random-input-len", "8", "--random-output-len", "4"])
    out = capsys.readouterr().out
    for label in ("Serving Benchmark Result", "Successful requests:                     4", "Output token throughput (tok/s):",
                  "Median TTFT (ms):", "P99 ITL (ms):", "P90 TPOT (ms):", "Mean E2EL (ms):"):
        assert label in out, out
