"""The paper's experiments on the simulator (engine/experiments/figures.py) and their command line."""

import json
import subprocess
import sys

import pytest

from engine.experiments.figures import figure_2, figure_12, figure_13, latency_sweep, reproduce_figure, sustainable_rate


def test_sustainable_rate_is_the_interpolated_crossing_of_twice_the_lowest_rate_latency():
    """Latency 1.0 at the lowest rate, limit 2.0: between rate 2 (1.5) and rate 3 (3.0) the line
    crosses 2.0 a third of the way: 2 + 0.5 / 1.5 = 2.33. A curve that stays flat has no crossing."""
    assert sustainable_rate([1, 2, 3, 4], [1.0, 1.5, 3.0, 5.0]) == (pytest.approx(2 + 1 / 3), True)
    assert sustainable_rate([1, 2, 3], [1.0, 1.2, 1.9]) == (3, False)


def test_vllm_keeps_its_latency_where_orca_max_runs_away():
    """ShareGPT at 1 req/s: Orca (Max) batches at most 7 requests and its queue grows; vLLM's
    normalized latency stays near its low-load value."""
    rows = latency_sweep(("sharegpt",), {"sharegpt": (0.25, 1.0)}, systems=("Orca (Max)", "vLLM"), num_requests=300)
    lat = {(r["system"], r["request_rate"]): r["normalized_latency_s"] for r in rows}
    assert lat["Orca (Max)", 1.0] > 5 * lat["Orca (Max)", 0.25]
    assert lat["vLLM", 1.0] < 1.5 * lat["vLLM", 0.25]
    assert all(r["mean_tpot_s"] > 0.02 and r["mean_ttft_s"] > 0 for r in rows)  # a step is >= 29 ms here


def test_figure_13_orca_max_batches_floor_of_slots_over_max_len():
    """Orca (Max) reserves 2,048 slots per request in buddy chunks of 2,048: 15,700 slots hold 7."""
    rows = figure_13(num_requests=400)
    for r in rows:
        if r["system"] == "Orca (Max)":
            assert r["mean_batched_requests"] == pytest.approx(7.0, abs=0.2)
        assert r["paper_mean_batched_requests"] > 0
    vllm = [r for r in rows if r["system"] == "vLLM"]
    assert all(v["mean_batched_requests"] > 2 * 7 for v in vllm)


def test_figure_2_states_its_rate_and_keeps_the_orca_order():
    rows = figure_2(num_requests=300)
    share = {r["system"]: r["token_state_fraction"] for r in rows}
    assert share["Orca (Max)"] < share["Orca (Pow2)"] < share["Orca (Oracle)"]
    assert all(r["request_rate"] == 1.0 for r in rows)
    assert next(r for r in rows if r["system"] == "vLLM")["token_state_share_of_in_use"] > 0.9


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="empty sweep"):
        latency_sweep(("sharegpt",), {"sharegpt": ()})
    with pytest.raises(ValueError, match="> 0 requests/s"):
        latency_sweep(("sharegpt",), {"sharegpt": (1.0, 0.0)})
    with pytest.raises(ValueError, match="unknown system"):
        latency_sweep(("sharegpt",), {"sharegpt": (1.0,)}, systems=("Orca (Half)",))
    with pytest.raises(ValueError, match="unknown figure '99'"):
        reproduce_figure("99")
    with pytest.raises(ValueError, match="num_requests must be >= 1"):
        reproduce_figure("2", num_requests=0)


def test_cli_prints_json_and_draws_the_chart(tmp_path, capsys):
    from visualize.cli import main as visualize_main  # charts: matplotlib, outside the engine

    out = tmp_path / "fig13.png"
    visualize_main(["reproduce-paper", "--figure", "13", "--num-requests", "200", "--json", "--out", str(out)])
    rows = json.loads(capsys.readouterr().out)
    assert {r["workload"] for r in rows} == {"sharegpt", "alpaca"} and len(rows) == 8
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_engine_never_imports_matplotlib():
    """The simulator, the experiments and the command line import no chart library; a figure's run gives
    its numbers without one (its chart is drawn by `python -m visualize reproduce-paper --out`)."""
    code = ("import sys, engine, engine.sim.simulator, engine.experiments.figures, engine.sim.cost_model, engine.sim.clock, "
            "engine.tools.calibrate, engine.cli, engine.experiments.cli; engine.cli.build_parser(); "
            "engine.experiments.figures.reproduce_figure('2', num_requests=50, progress=False); "
            "assert 'matplotlib' not in sys.modules and 'streamlit' not in sys.modules, 'imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_figure_12_chart_shows_the_simulated_curves_and_the_papers_ratio():
    from visualize.paper import plot_latency_vs_rate

    result = figure_12(num_requests=150, rates={"sharegpt": (0.25, 1.0, 2.0), "alpaca": (5.0, 40.0)})
    fig = plot_latency_vs_rate(result)
    sharegpt = fig.axes[0]
    lines = {line.get_label(): line for line in sharegpt.get_lines() if not line.get_label().startswith("_")}
    assert set(lines) == {"Orca (Max)", "Orca (Pow2)", "Orca (Oracle)", "vLLM", "FasterTransformer"}
    vllm = [r["normalized_latency_s"] for r in result["rows"] if r["workload"] == "sharegpt" and r["system"] == "vLLM"]
    assert list(lines["vLLM"].get_xdata()) == [0.25, 1.0, 2.0] and list(lines["vLLM"].get_ydata()) == vllm
    assert "paper 1.7-2.7x" in sharegpt.get_title() and sharegpt.get_ylabel() == "normalized latency (s/token)"
    assert "vs FasterTransformer" in sharegpt.get_title() and "(paper up to 22x)" in sharegpt.get_title()


def test_sweep_rates_keep_the_papers_and_scale_with_the_presets_capacity():
    """The paper's preset sweeps the paper's rates, as before; an H100 with Llama-3-8B serves far
    more (its rates scale with vLLM's estimated capacity), and a faster clock never lowers the rates."""
    from engine.experiments.figures import SETUP, STATIC_LOW_RATES, SWEEP_RATES, steady_requests, sweep_rates, vllm_capacity

    for w in ("sharegpt", "alpaca"):
        assert sweep_rates(w, SETUP) == (SWEEP_RATES[w], STATIC_LOW_RATES[w])
        assert steady_requests(w, SETUP) == 500
        paper, peak, h100 = (vllm_capacity(w, s) for s in (SETUP, "a100-opt-13b", "h100-llama-3-8b"))
        assert paper.rate < peak.rate < h100.rate  # achieved < peak figures < a newer GPU and a smaller model
        rates, low = sweep_rates(w, "h100-llama-3-8b")
        scale = h100.rate / paper.rate
        assert rates == pytest.approx([r * scale for r in SWEEP_RATES[w]], rel=0.05) and len(low) == len(STATIC_LOW_RATES[w])
        assert steady_requests(w, "h100-llama-3-8b") >= 8 * h100.batch
    # ShareGPT on the paper's pool: 15,700 slots // (161 + 338 / 2 tokens) = 47 running requests.
    assert vllm_capacity("sharegpt", SETUP).batch == 47


def test_a_sweep_can_run_in_the_presets_own_pool():
    """kv_slots / max_model_len None = the preset's: the H100's 426K slots run Orca (Max) with 52
    reservations of 8,192, far more than the paper pool's 7, and the latency differs."""
    from engine.sim.cost_model import get_setup

    h100 = get_setup("h100-llama-3-8b")
    kw = dict(systems=("Orca (Max)",), num_requests=200, setup="h100-llama-3-8b")
    own = latency_sweep(("sharegpt",), {"sharegpt": (20.0,)}, kv_slots=None, max_model_len=None, **kw)
    paper_pool = latency_sweep(("sharegpt",), {"sharegpt": (20.0,)}, **kw)
    assert h100.kv_slots // h100.max_model_len == 52
    assert own[0]["mean_batched_requests"] > 7.5 > paper_pool[0]["mean_batched_requests"]
    assert own[0]["normalized_latency_s"] < paper_pool[0]["normalized_latency_s"]
    with pytest.raises(ValueError, match="unknown cost-model preset"):
        latency_sweep(("sharegpt",), setup="b200", kv_slots=None, max_model_len=None)


def test_a_system_saturated_at_the_lowest_rate_is_shown_below_the_sweep():
    """Alpaca at 5 req/s: Orca (Max) (7 requests at once) already queues, its normalized latency many
    times vLLM's; the table gives its rate as under 5 req/s, not the crossing of 2x a loaded value."""
    from engine.experiments.figures import rate_table

    rows = latency_sweep(("alpaca",), {"alpaca": (5.0, 10.0, 20.0)}, systems=("Orca (Max)", "Orca (Oracle)", "vLLM"), num_requests=300)
    table = {r["system"]: r for r in rate_table(rows)}
    assert table["Orca (Max)"]["loaded_at_lowest"] and table["Orca (Max)"]["rate"] == 5.0
    assert not table["Orca (Oracle)"]["loaded_at_lowest"] and not table["vLLM"]["loaded_at_lowest"]
    assert table["Orca (Max)"]["ratio"] == table["vLLM"]["rate"] / 5.0 and table["vLLM"]["ratio"] is None
