"""`python -m engine bench-serve` against the lab's own server (a tiny random model): every request
is counted, its tokens are the ones asked for, and the latency figures hang together; its datasets,
goodput and the simulator's prediction of a trace; and real `vllm bench serve` driving the lab's
server on the default model."""

from __future__ import annotations

import json
import math
import subprocess

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
                  "Median TTFT (ms):", "P99 ITL (ms):", "P90 TPOT (ms):", "Mean E2EL (ms):", "CPU ISA (this machine's):"):
        assert label in out, out


def test_datasets_follow_vllms_conventions(default_model_dir):
    from engine.model_executor.model_loader import load_tokenizer

    from engine.tools.serve_datasets import prefix_repetition_dataset, sharegpt_dataset

    tokenizer = load_tokenizer(default_model_dir)
    requests = sharegpt_dataset(40, tokenizer, max_model_len=512, seed=1)
    assert all(len(tokenizer(r.prompt).input_ids) == r.prompt_len for r in requests)  # real text of exactly its length
    assert all(isinstance(r.prompt, str) and r.prompt_len + r.output_len <= 512 for r in requests)
    assert len({r.prompt for r in requests}) == 40 and np.std([r.output_len for r in requests]) > 10  # drawn lengths, varied
    assert [r.prompt for r in sharegpt_dataset(40, tokenizer, 512, seed=1)] == [r.prompt for r in requests]  # the seed decides
    assert {r.output_len for r in sharegpt_dataset(5, tokenizer, 512, seed=1, output_len=7)} == {7}
    repeated = prefix_repetition_dataset(10, prefix_len=16, suffix_len=8, num_prefixes=3, output_len=5, vocab_size=1000, seed=0)
    assert len(repeated) == 9 and all(r.prompt_len == 24 and r.output_len == 5 for r in repeated)  # 10 // 3 per prefix
    prefixes = [tuple(r.prompt[:16]) for r in repeated]
    assert len(set(prefixes)) == 3 and all(prefixes.count(p) == 3 for p in prefixes)
    assert len({tuple(r.prompt[16:]) for r in repeated}) == 9
    with pytest.raises(ValueError, match="num-prompts"):
        prefix_repetition_dataset(2, 16, 8, 3, 5, 1000, 0)


def test_goodput_counts_requests_within_every_slo():
    from engine.tools.bench_serve import RequestResult, calculate_metrics, parse_goodput

    fast = RequestResult(success=True, output_tokens=11, ttft=0.1, latency=0.6)  # TPOT 50 ms
    slow_start = RequestResult(success=True, output_tokens=11, ttft=2.0, latency=2.5)
    slow_tokens = RequestResult(success=True, output_tokens=11, ttft=0.1, latency=3.1)  # TPOT 300 ms
    slos = parse_goodput(["ttft:1000", "tpot:100"])
    assert slos == {"ttft": 1000.0, "tpot": 100.0}
    result = calculate_metrics([fast, slow_start, slow_tokens, RequestResult()], 2.0, [50.0], ["ttft"], slos)
    assert result["request_goodput"] == 0.5 and result["request_throughput"] == 1.5 and result["failed"] == 1
    for bad in (["ttft"], ["itl:5"], ["tpot:x"], ["e2el:-1"]):
        with pytest.raises(ValueError, match="--goodput"):
            parse_goodput(bad)


def test_prediction_takes_the_trace_as_sent():
    """The simulator's prediction of a trace: requests in the order given, arrivals as sent; a lone
    request's TTFT is its prefill step, its TPOT one decode step; queueing shows in the TTFT."""
    from engine.sim.cost_model import CostModel
    from engine.sim.online import compare_prediction, predict_trace

    model = CostModel.fixed(10.0)  # every step 10 ms
    settings = dict(block_size=16, num_blocks=64, max_num_seqs=1, max_model_len=256, max_num_batched_tokens=256, cost_model=model)
    alone = predict_trace([0.0], [20], [5], **settings)
    assert alone["ttft_s"] == [pytest.approx(0.010)] and alone["tpot_s"] == [pytest.approx(0.010)] and alone["e2el_s"] == [pytest.approx(0.050)]
    # Two at once, one at a time (max_num_seqs 1): the second waits for the first's 5 steps.
    both = predict_trace([0.5, 0.5], [20, 20], [5, 5], **settings)
    assert sorted(both["ttft_s"]) == [pytest.approx(0.010), pytest.approx(0.060)]
    late_first = predict_trace([1.0, 0.0], [20, 20], [5, 5], **settings)  # given out of order: results stay in it
    assert late_first["ttft_s"] == [pytest.approx(0.010), pytest.approx(0.010)]
    c = compare_prediction(alone, {"ttft": [0.020], "tpot": [0.010], "e2el": [None]})
    assert c["ttft"]["mean"]["error"] == pytest.approx(-0.5) and c["tpot"]["p90"]["error"] == pytest.approx(0.0) and "e2el" not in c


def test_predict_checks_the_server_before_sending_anything(tiny_llama_dir, capsys, monkeypatch, tmp_path):
    """--predict against a lab server whose pool is not the one it would simulate stops before the load,
    naming the flags; a server that caches prefixes (which the simulation does not) gets a warning."""
    from engine.sim import cost_model

    # --predict simulates with this machine's fit: a test's own (a preset's model), not the user cache's.
    fit = cost_model.get_setup("a100-opt-13b")
    path = tmp_path / "cost_model_this_machine.json"
    path.write_text(json.dumps({"cost_model": fit.cost_model.to_json(), "kv_slots": fit.kv_slots, "max_model_len": fit.max_model_len}))
    monkeypatch.setattr(cost_model, "calibration_path", lambda: path)
    with serving(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=128, enable_prefix_caching=True)) as (base, _):
        flags = ["bench-serve", "--base-url", base, "--num-prompts", "3", "--random-input-len", "16", "--random-output-len", "4", "--predict"]
        with pytest.raises(SystemExit) as stopped:
            main([*flags, "--num-gpu-blocks-override", "999"])
        assert stopped.value.code == 2
        assert "the server's KV pool has 128 blocks, the simulation 999" in capsys.readouterr().err
        assert metrics(base)["vllm:prompt_tokens_total"] == 0  # nothing was sent
        main([*flags, "--num-gpu-blocks-override", "128", "--json"])
        captured = capsys.readouterr()
    assert "the server caches prefixes and the simulation does not" in captured.err
    assert json.loads(captured.out)["completed"] == 3


def test_calibrating_on_a_servers_own_steps(tiny_llama_dir, monkeypatch, tmp_path):
    """``calibrate --server`` fits the step-time model on the steps a lab server ran while it served
    the calibration load: every step it counted is one the server reported, the fit predicts their
    summed time, and the fit is saved where the simulator's "this-machine" preset reads it."""
    from engine.sim import cost_model
    from engine.sim.cost_model import THIS_MACHINE, get_setup
    from engine.tools import calibrate, calibrate_server as cs

    monkeypatch.setattr(cs, "CONCURRENCY", (1, 4))
    monkeypatch.setattr(cs, "PROMPT_LENS", (8, 40))
    monkeypatch.setattr(cs, "OUTPUT_LENS", (8, 24))
    for module in (cost_model, calibrate):  # the fit goes to this test's directory, not the user's cache
        monkeypatch.setattr(module, "calibration_path", lambda: tmp_path / "cost_model_this_machine.json")
    with serving(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=64)) as (base, app):
        result = cs.calibrate_server(base, progress=lambda _: None)
        served = metrics(base)
        session = json.loads(app.state.hub.run_file())
    assert served["vllm:request_success_total"] == 2 * 1 + 2 * 4  # the calibration load, all completed
    fit = result["fit"]
    assert result["server"]["steps"] == fit["steps"] == sum(1 for step in session["steps"] if step["scheduled"]) >= 50
    assert fit["predicted_s"] == pytest.approx(fit["measured_s"], rel=0.05)
    assert 0 < result["server"]["engine_share"] <= 1 and result["server"]["between_steps_ms"] >= 0
    assert result["cost_model"]["step_overhead_s"] > 0 and result["kv_slots"] == 64 * 16
    assert get_setup(THIS_MACHINE).cost_model.to_json() == result["cost_model"]
    with pytest.raises(ValueError, match="cannot ask the server at http://127.0.0.1:9"):  # nothing listens there
        cs.calibrate_server("http://127.0.0.1:9", progress=lambda _: None)


def test_real_vllm_bench_serve_drives_the_lab_server(default_model_dir, tmp_path):
    """vLLM's own benchmark CLI (`vllm bench serve`, unmodified, from the venv of `python -m engine vllm
    setup`) against the lab's server on the default model: 8 random prompts, none failed."""
    from engine.vllm_bridge.env import setup, why_not_supported

    reason = why_not_supported()
    if reason:
        pytest.skip(reason)
    from engine.tools.bench_serve_vllm import vllm_cli_env

    python = setup(progress=lambda line: None)
    engine = LLMEngine(EngineConfig(num_gpu_blocks=64, max_num_seqs=8))
    with serving(engine) as (base, _):
        done = subprocess.run(
            [str(python), "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "openai", "--base-url", base,
             "--endpoint", "/v1/completions", "--model", engine.model_name, "--tokenizer", str(default_model_dir),
             "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", "8", "--num-prompts", "8",
             "--ignore-eos", "--temperature", "0", "--save-result", "--result-dir", str(tmp_path), "--result-filename", "vllm.json",
             "--disable-tqdm"],
            capture_output=True, text=True, env=vllm_cli_env(python), timeout=900)
        served = metrics(base)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "vllm.json").read_text())
    assert result["completed"] == 8 and result["failed"] == 0, result.get("errors")
    assert result["total_output_tokens"] == 64  # ignore_eos: every request its 8 tokens
    assert served["vllm:generation_tokens_total"] >= 64  # vLLM's ready check sends one more request first
    assert "Serving Benchmark Result" in done.stdout


def test_sharegpt_load_returns_each_requests_token_ids(tiny_llama_dir, capsys):
    """Text prompts of exact lengths, the server's token ids per request (vLLM's return_token_ids),
    goodput beside throughput."""
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=128, max_model_len=256))
    with serving(engine) as (base, _):
        main(["bench-serve", "--base-url", base, "--dataset-name", "sharegpt", "--num-prompts", "6", "--sharegpt-output-len", "6",
              "--return-token-ids", "--goodput", "ttft:60000", "--json", "--tokenizer", str(tiny_llama_dir)])
        result = json.loads(capsys.readouterr().out)
        served = metrics(base)
    assert result["completed"] == 6 and result["total_output_tokens"] == 36
    assert [len(ids) for ids in result["token_ids"]] == [6] * 6
    assert result["total_input_tokens"] == served["vllm:prompt_tokens_total"]  # the text's lengths are the server's
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])


def test_the_server_returns_token_ids_like_vllm(tiny_llama_dir):
    """vLLM's ``return_token_ids``: the whole answer's choice carries its token ids, and a stream's
    chunks carry the ones each adds (one per step), joined they are the offline run's tokens."""
    import httpx

    from engine import LLM, SamplingParams

    prompt = [5, 17, 99, 3, 250, 8]
    offline = LLM(model=str(tiny_llama_dir), num_gpu_blocks=64).generate([prompt], SamplingParams(max_tokens=9, ignore_eos=True))[0]
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=64))
    body = {"prompt": prompt, "max_tokens": 9, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    with serving(engine) as (base, _):
        whole = httpx.post(f"{base}/v1/completions", json=body, timeout=60).json()
        chunks = []
        with httpx.stream("POST", f"{base}/v1/completions", json=body | {"stream": True}, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:])["choices"][0])
        refused = httpx.post(f"{base}/v1/completions", json=body | {"return_token_ids": "yes"}, timeout=60)
    assert whole["choices"][0]["token_ids"] == offline.token_ids
    assert [c["token_ids"] for c in chunks] == [[t] for t in offline.token_ids]
    assert "".join(c["text"] for c in chunks) == whole["choices"][0]["text"]
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "return_token_ids"


def test_against_vllm_gives_both_servers_equal_settings_and_compares_tokens(tmp_path):
    from engine.tools.bench_serve_vllm import commands, compare_token_ids, parse_rates

    settings = dict(block_size=32, num_blocks=64, max_num_seqs=8, max_model_len=2048, max_num_batched_tokens=2048)
    lines = commands(tmp_path, "SmolLM2-135M-Instruct", settings, prefix_caching=False, vllm_python=tmp_path / "python")

    def flags(line):
        return {a: b for a, b in zip(line, line[1:]) if a.startswith("--")}

    lab, vllm = flags(lines["lab"]), flags(lines["vllm"])
    for name in ("--block-size", "--max-num-seqs", "--max-model-len", "--max-num-batched-tokens", "--dtype", "--served-model-name"):
        assert lab[name] == vllm[name], name
    assert int(vllm["--num-gpu-blocks-override"]) == int(lab["--num-gpu-blocks-override"]) + 1  # vLLM's null block
    for line in lines.values():
        assert "--no-enable-chunked-prefill" in line and "--no-enable-prefix-caching" in line
    assert lines["vllm"][:4] == [str(tmp_path / "python"), "-m", "vllm.entrypoints.cli.main", "serve"]
    same = compare_token_ids([[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 5]])
    assert same["identical"] and same["num_identical"] == 2
    differ = compare_token_ids([[1, 2, 3], [4, 5], None], [[1, 9, 3], [4, 5, 6], [7]])
    assert not differ["identical"] and differ["num_identical"] == 0
    assert [(m["request"], m["position"]) for m in differ["mismatches"]] == [(0, 1), (1, 2), (2, None)]
    assert parse_rates("1,4,inf") == [1.0, 4.0, math.inf]
    for bad in ("1,x", "0,1", ""):
        with pytest.raises(ValueError, match="--request-rates"):
            parse_rates(bad)
