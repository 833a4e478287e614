"""The step-time model (engine/sim/cost_model.py), its fit (engine/tools/calibrate.py) and the simulator's clock."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.tools.calibrate import GRID, GRID_DECODE_STEPS, fit_cost_model, prediction_error
from engine.sim.cost_model import (A100_40GB, OPT_13B, SETUPS, CostModel, PicosecondCost, StepShape, get_setup,
                               prefill_pairs)
from engine.sim.simulator import SimulationConfig, simulate
from engine.sim.workloads import make_workload

A100 = get_setup("a100-opt-13b").cost_model


def decode(batch: int, context: int = 128, block_size: int | None = 16) -> StepShape:
    return StepShape.of_batch([], [context] * batch, block_size)


shapes = st.builds(StepShape, st.integers(0, 8), st.integers(0, 4000), st.integers(0, 10**6), st.integers(0, 256),
                   st.integers(0, 10**6), st.integers(0, 10**5))


@settings(max_examples=200, deadline=None)
@given(shape=shapes, field=st.sampled_from(["num_prefills", "prefill_tokens", "prefill_pairs", "num_decodes",
                                            "decode_context", "kv_blocks"]),
       more=st.integers(1, 1000), roofline=st.booleans())
def test_more_work_never_takes_less_time(shape, field, more, roofline):
    """Monotonicity: one more token, pair, context token, block or sequence never shortens a step,
    in the roofline form and in the fitted (additive) form."""
    from dataclasses import replace

    model = replace(A100, roofline=roofline, seq_overhead_s=1e-6)
    bigger = replace(shape, **{field: getattr(shape, field) + more})
    assert model.step_time(bigger) >= model.step_time(shape)


def test_a100_opt13b_decode_is_weight_bound_at_batch_one_and_crosses_to_compute():
    """26 GB of weights at 1.555 TB/s: a batch-1 decode takes about 17 ms, almost all of it reading
    weights. Up to the crossover (weights_s / token_s = peak FLOP/s * bytes / FLOPs = about 200
    tokens) a bigger batch costs little more; past it time grows linearly with the batch."""
    def short(batch):  # short contexts: the linear layers' roofline alone decides
        return A100.step_time(decode(batch, context=16, block_size=None))

    one = short(1)
    assert 16e-3 < one < 19e-3
    assert A100.weights_s / one > 0.9
    crossover = A100.weights_s / A100.token_s
    assert 150 < crossover < 250
    assert short(64) < 1.05 * one and short(128) < 1.1 * one
    t512, t1024 = short(512), short(1024)
    assert t512 > 2 * one and 1.8 < t1024 / t512 < 2.1  # compute-bound: about linear
    # Long contexts add the KV read: 64 x 1,024 tokens x 800 KB at 1.555 TB/s = 35 ms more.
    assert A100.step_time(decode(64, 1024, None)) - short(64) == pytest.approx(64 * 1008 * A100.kv_token_s, rel=0.01)


def test_paged_kernel_is_about_23_percent_slower_than_contiguous_at_block_size_16():
    """§7.1: 20-26%. Decode attention of 32 sequences x 512 tokens, paged (block 16) vs contiguous."""
    paged, contiguous = decode(32, 512, 16), decode(32, 512, None)
    attention = A100.attention_time(paged.decode_context, paged.decode_context)
    extra = A100.step_time(paged) - A100.step_time(contiguous)
    assert 0.20 <= extra / attention <= 0.26


def test_prefill_pairs_and_shapes():
    assert prefill_pairs(4, 4) == 1 + 2 + 3 + 4
    assert prefill_pairs(2, 10) == 9 + 10  # a chunk of 2 after 8 cached tokens
    s = StepShape.of_batch([(4, 4)], [17, 5], block_size=16)
    assert (s.num_prefills, s.prefill_tokens, s.prefill_pairs, s.num_decodes, s.decode_context, s.kv_blocks) == (1, 4, 10, 2, 22, 4)
    with pytest.raises(ValueError, match="new tokens"):
        StepShape.of_batch([(5, 4)], [], 16)
    with pytest.raises(ValueError, match="context"):
        StepShape.of_batch([], [0], 16)


def test_the_fit_recovers_known_coefficients_from_a_synthetic_engine():
    """A synthetic engine whose step time is a known additive model (plus seeded noise of 0.05 ms) on
    the calibration's own grid of shapes: the fit finds each coefficient within 5%."""
    truth = CostModel("synthetic", step_overhead_s=4e-3, weights_s=0.0, token_s=3e-4, pair_s=2e-7, kv_token_s=5e-7,
                      block_s=2e-6, seq_overhead_s=1e-4, roofline=False)
    rng = np.random.default_rng(0)
    grid = []
    for block_size, batches, prompts in GRID:
        for batch in batches:
            for prompt in prompts:
                grid.append(StepShape.of_batch([(prompt, prompt)] * batch, [], block_size))
                grid += [StepShape.of_batch([], [prompt + i] * batch, block_size) for i in range(1, GRID_DECODE_STEPS + 1)]
    times = [truth.step_time(s) + 5e-5 * rng.standard_normal() for s in grid]
    fitted = fit_cost_model(grid, times)
    for name in ("step_overhead_s", "token_s", "pair_s", "kv_token_s", "block_s", "seq_overhead_s"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=0.05), name
    assert abs(prediction_error(fitted, grid, times)["total_error"]) < 0.01
    with pytest.raises(ValueError, match="at least"):
        fit_cost_model(grid[:3], times[:3])


@settings(max_examples=100, deadline=None)
@given(k=st.integers(1, 50), running=st.integers(1, 64), context=st.integers(1, 3000), roofline=st.booleans())
def test_integer_clock_sums_a_decode_stretch_exactly(k, running, context, roofline):
    """The simulator's picosecond clock: k decode steps in closed form = the k steps one by one."""
    from dataclasses import replace

    ps = PicosecondCost.of(replace(A100, roofline=roofline, seq_overhead_s=3e-6))
    steps = [StepShape(0, 0, 0, running, running * (context + j), running * -(-(context + j) // 16)) for j in range(k)]
    total = ps.decode_steps(k, running, sum(s.decode_context for s in steps), sum(s.kv_blocks for s in steps))
    assert total == sum(ps.step(s) for s in steps)


@pytest.mark.parametrize("system", [dict(allocator="paged"), dict(allocator="contiguous", reservation="pow2", placement="buddy")])
def test_the_clock_is_the_same_fast_or_step_by_step_and_deterministic(system):
    requests = make_workload("sharegpt", 120, seed=3, max_model_len=1024, request_rate=3.0)
    small = dict(kv_slots=3000, max_model_len=1024, max_num_seqs=32, cost_model="a100-opt-13b", **system)
    fast, slow, again = simulate(requests=requests, **small), simulate(requests=requests, **small, fast_forward=False), \
        simulate(requests=requests, **small)
    figures = ("steps", "simulated_seconds", "normalized_latency_s", "mean_ttft_s", "mean_tpot_s", "throughput_tokens_per_s")
    assert [getattr(fast, f) for f in figures] == [getattr(slow, f) for f in figures] == [getattr(again, f) for f in figures]
    assert np.array_equal(fast.request_latency_s, slow.request_latency_s)
    assert fast.completed == 120 and fast.normalized_latency_s > 0
    # Every request's latency covers its output: at least one step of >= 17 ms per output token.
    outputs = np.array([r.output_len for r in sorted(requests, key=lambda r: r.arrival)])
    assert np.all(fast.request_latency_s >= outputs * 0.017)


def test_latency_grows_with_the_request_rate():
    base = dict(workload="sharegpt", num_requests=300, seed=1, cost_model="a100-opt-13b")
    low, high = simulate(**base, request_rate=0.5), simulate(**base, request_rate=50.0)
    assert high.normalized_latency_s > 2 * low.normalized_latency_s
    assert high.throughput_requests_per_s > low.throughput_requests_per_s


def test_bad_input_is_a_clear_error(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown cost-model preset 'tpu'"):
        get_setup("tpu")
    with pytest.raises(ValueError, match="unknown cost-model preset"):
        SimulationConfig(cost_model="tpu")
    with pytest.raises(ValueError, match="request_rate must be > 0"):
        SimulationConfig(request_rate=0.0)
    with pytest.raises(ValueError, match="request_rate must be > 0"):
        SimulationConfig(request_rate=-1.0)
    monkeypatch.setenv("PAGEDATTENTION_LAB_CACHE", str(tmp_path))
    with pytest.raises(ValueError, match="python -m engine calibrate"):
        get_setup("this-machine")
    with pytest.raises(ValueError, match="finite time"):
        CostModel("broken", math.nan, 0, 0, 0, 0, 0)
    assert "this-machine" in SETUPS and CostModel.from_figures(A100_40GB, OPT_13B).name == "OPT-13B on A100-40GB"
