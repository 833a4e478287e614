"""Prefill/decode disaggregation on the simulator (engine/sim/disagg.py), model-free: the KV transfer's
time, decode instances that never prefill, the transfer as the only TTFT difference when nothing
interferes, lower TPOT tails once prefills stall colocated decodes, goodput that grows with the SLO,
and GPU counts of the equal-GPU comparison."""

from __future__ import annotations

import numpy as np
import pytest

from engine.sim.cost_model import get_setup
from engine.sim.disagg import LINKS, SLO, Deployment, attainment, goodput, poisson_requests, serve, sweep, transfer_s
from engine.cli import main
from engine.sim.simulator import SimulationConfig, simulate
from engine.sim.workloads import Request

SETUP = get_setup("h100-llama-3-8b")  # Llama-3-8B on one H100 at peak figures
KV_BYTES = 2 * 32 * 8 * 128 * 2  # Llama-3-8B, bf16: 131,072 B per token
INSTANCE = SimulationConfig(num_requests=1, kv_slots=SETUP.kv_slots, max_model_len=4096, cost_model=SETUP.cost_model,
                            schedule_first="decodes", max_num_batched_tokens=4096)


def test_the_transfer_takes_the_prompts_kv_bytes_over_the_bandwidth():
    assert transfer_s(2048, KV_BYTES, LINKS["rdma-100g"]) == pytest.approx(2048 * 131_072 / 12.5e9)  # 21.5 ms
    requests = [Request(0.0, 2048, 8), Request(5.0, 100, 8)]
    times = serve(requests, INSTANCE, Deployment(1, 1), KV_BYTES, LINKS["nvlink"])
    assert times.transfer_s.tolist() == pytest.approx([2048 * KV_BYTES / 450e9, 100 * KV_BYTES / 450e9])
    assert serve(requests, INSTANCE, Deployment(num_colocated=1)).transfer_s.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError):
        transfer_s(10, KV_BYTES, 0.0)


def test_a_decode_instance_never_computes_a_prompt_token():
    requests = poisson_requests(np.full(60, 700), np.full(60, 40), rate=30.0, seed=1)
    times = serve(requests, INSTANCE, Deployment(2, 1), KV_BYTES)
    assert times.prefill_tokens == {"prefill": 60 * 700, "decode": 0}
    assert not np.isnan(times.e2el_s).any()  # every request was served, its output decoded on the decode instance
    alone = simulate(INSTANCE, requests=requests, kv_role="kv_consumer")
    assert alone.prefill_tokens_computed == 0 and alone.completed == 60
    assert simulate(INSTANCE, requests=requests, kv_role="kv_producer").steps < simulate(INSTANCE, requests=requests).steps


def test_without_interference_disaggregation_adds_only_the_transfer_to_ttft():
    # One request every 10 s: each runs alone on every instance, whatever the deployment.
    requests = [Request(10.0 * i, p, o) for i, (p, o) in enumerate([(512, 64), (2048, 16), (37, 200)])]
    colocated = serve(requests, INSTANCE, Deployment(num_colocated=2))
    split = serve(requests, INSTANCE, Deployment(1, 1), KV_BYTES, LINKS["rdma-100g"])
    assert (split.ttft_s - colocated.ttft_s) == pytest.approx(split.transfer_s, abs=1e-9)
    assert split.transfer_s[1] == pytest.approx(2048 * KV_BYTES / 12.5e9)
    assert split.tpot_s == pytest.approx(colocated.tpot_s, rel=0.01)  # decoding alone costs the same on either


def test_where_prefills_stall_colocated_decodes_the_split_tpot_tail_is_lower():
    requests = poisson_requests(np.full(200, 2048), np.full(200, 128), rate=20.0, seed=0)
    colocated = serve(requests, INSTANCE, Deployment(num_colocated=2))
    split = serve(requests, INSTANCE, Deployment(1, 1), KV_BYTES)
    p99 = lambda t: np.nanpercentile(t.tpot_s, 99)  # noqa: E731
    assert p99(split) < 0.9 * p99(colocated), (p99(split), p99(colocated))
    assert p99(colocated) > 1.5 * serve(requests[:1], INSTANCE, Deployment(num_colocated=1)).tpot_s[0]  # the stall is there


def test_goodput_grows_with_the_slo():
    rates = [4.0, 8.0, 12.0, 16.0, 20.0, 24.0, 32.0, 40.0]
    runs = [serve(poisson_requests(np.full(120, 1024), np.full(120, 64), r, seed=2), INSTANCE, Deployment(num_colocated=1)) for r in rates]

    def goodput_at(ttft_ms: float, tpot_ms: float) -> float:
        slo = SLO(ttft_ms / 1e3, tpot_ms / 1e3)
        return goodput(rates, [attainment(times, slo)["both"] for times in runs], slo.target)

    for ttft_ms, tpot_ms in [(50, 8), (100, 8), (100, 12), (1000, 12), (1000, 100)]:
        for looser in [(2 * ttft_ms, tpot_ms), (ttft_ms, 2 * tpot_ms)]:
            assert goodput_at(*looser) >= goodput_at(ttft_ms, tpot_ms)
    assert goodput_at(50, 8) < goodput_at(1000, 100)  # the SLOs bind somewhere in the sweep
    assert goodput([1, 2, 3], [0.95, 0.5, 0.99], 0.9) == 1  # not the rate past a failing one


def test_attainment_counts_each_slo_and_both():
    times = serve([Request(0.0, 100, 10), Request(0.0, 100, 1)], INSTANCE, Deployment(num_colocated=1))
    assert attainment(times, SLO(1.0, 1.0)) == {"ttft": 1.0, "tpot": 1.0, "both": 1.0}
    assert attainment(times, SLO(1e-6, 1.0))["both"] == 0.0
    assert attainment(times, SLO(1.0, 1e-6)) == {"ttft": 1.0, "tpot": 0.5, "both": 0.5}  # a one-token output has no TPOT


def test_the_equal_gpu_comparison_counts_gpus():
    assert Deployment.parse("1P1D").num_gpus == 2 and Deployment.parse("1P1D").equal_gpus() == Deployment(num_colocated=2)
    two_one = Deployment.parse("2p1d", gpus_per_instance=4)
    assert (two_one.num_gpus, two_one.equal_gpus().num_gpus, two_one.equal_gpus().label) == (12, 12, "3C")
    assert Deployment.parse("3").label == "3C" and not Deployment.parse("3").disaggregated
    for bad in ("1P", "0P1D", "PD", "1P0D"):
        with pytest.raises(ValueError):
            Deployment.parse(bad)
    result = sweep(INSTANCE, [two_one, two_one.equal_gpus()], [5.0], SLO(1.0, 0.05), [256] * 30, [32] * 30, KV_BYTES)
    assert [(r["label"], r["gpus"]) for r in result["deployments"]] == [("2P1D", 12), ("3C", 12)]
    assert [r["goodput_per_gpu"] for r in result["deployments"]] == [5.0 / 12, 5.0 / 12]


def test_simulate_goodput_prints_both_deployments(capsys):
    main(["simulate", "--goodput", "--model", "llama-3-8b", "--gpu", "h100", "--disagg", "1P1D", "--prompt-len", "1024",
          "--output-len", "64", "--max-model-len", "2048", "--num-requests", "40", "--rates", "2,20", "--ttft-slo-ms", "500",
          "--tpot-slo-ms", "50", "--link", "pcie-5"])
    out = capsys.readouterr().out
    assert "SLOs: TTFT <= 500 ms, TPOT <= 50 ms, target 90% of requests" in out
    goodputs = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith(("1P1D ", "2C "))}
    assert set(goodputs) == {"1P1D", "2C"}
    transfer_ms = 1024 * KV_BYTES / 64e9 * 1e3
    assert f"{transfer_ms:.2f}" in out  # 2.10 ms over PCIe 5.0
