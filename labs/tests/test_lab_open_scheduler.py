"""Lab open_scheduler: your scheduling policy on a fixed trace, judged by the simulator against FCFS.

The policy is ``ShortestPromptFirstScheduler.order_waiting`` of your file (any order you design: the
class name is the model answer's). The trace: 300 ShareGPT requests arriving at 3 per second (Poisson,
seed 0), OPT-13B on an A100 (the simulator's step-time model). Full marks: every request completes,
TTFT p90 at least 10% under FCFS's, and output throughput at least 95% of FCFS's.
"""

import json
import math
import os

import numpy as np
import pytest

from engine.core.scheduler import ShortestPromptFirstScheduler
from engine.sim.simulator import simulate

TRACE = dict(workload="sharegpt", num_requests=300, request_rate=3.0, seed=0, cost_model="a100-opt-13b")


def measure(cls):
    result = simulate(**TRACE, scheduler_cls=cls)
    ttft = result.request_ttft_s
    return {"ttft_p90_s": float(np.nanpercentile(ttft, 90)) if np.isfinite(ttft).any() else math.inf,
            "throughput_tokens_per_s": result.throughput_tokens_per_s, "completed": result.completed}


@pytest.fixture(scope="module")
def runs():
    yours, fcfs = measure(ShortestPromptFirstScheduler), measure(None)
    report = os.environ.get("LAB_REPORT")
    if report:  # the grader prints your place against FCFS and the model answer
        with open(report, "w") as f:
            json.dump({"yours": yours, "fcfs": fcfs}, f)
    return yours, fcfs


def test_every_request_completes(runs):
    yours, _ = runs
    assert yours["completed"] == TRACE["num_requests"], f"only {yours['completed']} of {TRACE['num_requests']} requests completed"


def test_ttft_p90_beats_fcfs(runs):
    yours, fcfs = runs
    assert yours["ttft_p90_s"] <= 0.9 * fcfs["ttft_p90_s"], \
        f"TTFT p90 {yours['ttft_p90_s']:.2f} s; FCFS {fcfs['ttft_p90_s']:.2f} s: aim for 10% under it (who waits behind whom?)"


def test_throughput_stays_within_5_percent_of_fcfs(runs):
    yours, fcfs = runs
    assert yours["throughput_tokens_per_s"] >= 0.95 * fcfs["throughput_tokens_per_s"], \
        f"throughput {yours['throughput_tokens_per_s']:.0f} tokens/s; FCFS {fcfs['throughput_tokens_per_s']:.0f}: keep within 5%"
