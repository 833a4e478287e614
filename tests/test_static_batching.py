"""Static batching (engine/baselines/static_batching.py), the FasterTransformer baseline of Figure 12, on workloads worked by hand."""

from __future__ import annotations

import pytest

from engine.experiments.figures import figure_12, format_figure
from engine.sim.simulator import simulate
from engine.sim.workloads import Request

# Three requests at t = 0, prompt 4 tokens each, outputs A 4, B 1, C 2 tokens. A pool of 16 slots
# with max_model_len 8 and Orca (Max)'s reservation holds two requests. One step = 1 s.
#
#   step          1     2     3     4     5     6
#   static:      A B   A     A     A     C     C      batch {A, B} until A is done, then {C}
#   continuous:  A B   A C   A C   A                  C joins as soon as B's room is free
#
# Static returns a batch together: B's result comes back with A's at 4 s.
REQUESTS = [Request(0.0, 4, 4), Request(0.0, 4, 1), Request(0.0, 4, 2)]
POOL = dict(kv_slots=16, block_size=4, max_model_len=8, allocator="contiguous", reservation="max", step_ms=1000.0)
# Orca's iteration-level scheduling, as drawn above: C's prompt joins A's decode in the same step. (vLLM
# v0's prefill-first rule, the simulator's default without chunked prefill, would give C a step of its own.)
CONTINUOUS = dict(policy="continuous", schedule_first="decodes")


def running_per_step(result) -> list[int]:
    """Requests running in each step (the series is run-length encoded on the fast path)."""
    return [int(r) for r, k in zip(result.series_running, result.series_num_steps) for _ in range(k)]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_static_batch_runs_until_its_longest_request_and_returns_together(fast_forward):
    static = simulate(requests=REQUESTS, policy="static", fast_forward=fast_forward, **POOL)
    assert static.steps == 6 and static.simulated_seconds == 6.0
    assert list(static.request_latency_s) == [4.0, 4.0, 6.0]
    assert static.normalized_latency_s == pytest.approx((4 / 4 + 4 / 1 + 6 / 2) / 3)
    assert running_per_step(static) == [2, 1, 1, 1, 1, 1]  # nothing joins A while it runs alone
    assert static.completed == 3 and static.preemptions == 0


def test_continuous_batching_admits_into_the_running_batch_on_the_same_pool():
    continuous = simulate(requests=REQUESTS, **CONTINUOUS, **POOL)
    assert continuous.steps == 4
    assert list(continuous.request_latency_s) == [4.0, 1.0, 3.0]
    assert running_per_step(continuous) == [2, 2, 2, 1]
    assert continuous.normalized_latency_s == pytest.approx((1 + 1 + 1.5) / 3)


def test_a_later_arrival_waits_for_the_whole_batch():
    """D arrives at 1.5 s while {A, B} runs: static admits it at step 5 (after A's 4 s), not at 2 s."""
    late = REQUESTS[:2] + [Request(1.5, 4, 1)]
    static = simulate(requests=late, policy="static", **POOL)
    assert list(static.request_latency_s) == [4.0, 4.0, 5.0 - 1.5]
    continuous = simulate(requests=late, **CONTINUOUS, **POOL)
    assert continuous.request_latency_s[2] == 3.0 - 1.5  # queued before step 3 (starts at 2 s), done at 3 s


def test_bad_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="policy must be one of continuous, static"):
        simulate(requests=REQUESTS, policy="orca", **POOL)
    with pytest.raises(ValueError, match="one-sequence requests"):
        simulate(requests=REQUESTS, policy="static", n=2, **POOL)


def test_figure_12_has_the_fastertransformer_line_and_ratio():
    result = figure_12(num_requests=60, rates={"sharegpt": (0.25, 1.0), "alpaca": (5.0, 20.0)})
    ft = [r for r in result["rows"] if r["system"] == "FasterTransformer"]
    orca_max = [r for r in result["rows"] if r["system"] == "Orca (Max)"]
    assert len(ft) == 4
    for f, o in zip(ft, orca_max):  # the same memory as Orca (Max), but no request joins a running batch
        assert f["normalized_latency_s"] > o["normalized_latency_s"]
    text = format_figure("12", result)
    assert any(line.startswith("FasterTransformer ") for line in text.splitlines())
    assert "vLLM / FasterTransformer" in text and "(paper up to 22x)" in text


@pytest.mark.parametrize("workload, rate", [("sharegpt", 0.3), ("alpaca", 2.0)])
def test_the_fast_path_gives_the_single_step_result(workload, rate):
    """Static batching on the lock-step fast path (a batch runs from one finish to the next at once)
    equals stepping one by one through schedule(), to the picosecond."""
    from engine.sim.workloads import make_workload

    requests = make_workload(workload, 150, 0, 2048, rate)
    kwargs = dict(requests=requests, kv_slots=15_700, block_size=16, allocator="contiguous", reservation="max",
                  placement="buddy", policy="static", cost_model="a100-opt-13b-achieved")
    fast, slow = simulate(fast_forward=True, **kwargs), simulate(fast_forward=False, **kwargs)
    assert fast.steps == slow.steps and fast.simulated_seconds == slow.simulated_seconds
    assert list(fast.request_latency_s) == list(slow.request_latency_s)
    assert fast.fragmentation == slow.fragmentation and fast.max_concurrent_requests == slow.max_concurrent_requests
    assert fast.series_num_steps.sum() == slow.series_num_steps.sum() and len(fast.series_step) < len(slow.series_step)
