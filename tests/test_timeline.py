"""The per-request timeline (engine/timeline.py, visualize/timeline.py): why requests wait, their
spans and latencies from real step reports, the same from a saved run file, and the Chrome trace."""

from __future__ import annotations

import dataclasses
import json

import pytest

from engine.sim.simulator import simulate
from engine.sim.workloads import Request
from engine.timeline import DECODE, PREFILL, WAITING, build_timeline, chrome_trace, step_times

LONG = "Summarise this passage in one sentence. " + "The lighthouse keeper climbed the stairs every evening at dusk. " * 8
SHORTS = ("What is 2 + 2?", "Name a primary colour.", "Name three fruits.")


def waiting_by_step(**settings) -> list[dict[int, str]]:
    requests = [Request(0.0, 16, 2), Request(0.0, 8, 2), Request(0.0, 4, 2)]
    config = dict(requests=requests, kv_slots=64, block_size=4, max_model_len=24, watermark=0, max_num_seqs=4, record_steps=True)
    return [r.waiting for r in simulate(**(config | settings)).step_reports]


def test_each_waiting_request_says_why_it_was_not_admitted():
    """The scheduler names the head of the queue's own reason and WAIT_QUEUE behind it (first come,
    first served), or one reason for all when no one could be admitted."""
    assert waiting_by_step(max_num_batched_tokens=24)[0] == {2: "budget"}  # 16 + 8 tokens: none left for 4
    assert waiting_by_step(max_num_seqs=1)[:3] == [{1: "max_num_seqs", 2: "max_num_seqs"}] * 2 + [{2: "max_num_seqs"}]
    assert waiting_by_step(kv_slots=24)[0] == {2: "no_free_block"}  # 4 + 2 blocks of 6 taken
    chunked = waiting_by_step(enable_chunked_prefill=True, max_num_batched_tokens=8)
    assert chunked[:2] == [{1: "budget", 2: "queue"}] * 2  # the 16-token prompt's chunks take the whole budget
    preempting = simulate(requests=[Request(0.0, 8, 12), Request(0.0, 8, 12)], kv_slots=24, block_size=4, max_model_len=24,
                          watermark=0, max_num_seqs=4, record_steps=True).step_reports
    step = next(r for r in preempting if r.preempted)
    assert step.waiting[step.preempted[0]] == "preemption"


def test_the_simulators_timeline_gives_its_own_latencies():
    """TTFT, TPOT and E2EL from the recorded steps are the simulator's own, and recording changes nothing."""
    settings = dict(num_requests=12, kv_slots=4000, cost_model="a100-opt-13b", request_rate=5.0, seed=1)
    recorded, plain = simulate(**settings, record_steps=True), simulate(**settings)
    rows = build_timeline(recorded.step_reports)
    assert len(rows) == 12 and all(r.finish_reason == "length" for r in rows)
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    assert mean([r.ttft_ms for r in rows]) == pytest.approx(plain.mean_ttft_s * 1e3, rel=1e-9)
    assert mean([r.tpot_ms for r in rows if r.tpot_ms is not None]) == pytest.approx(plain.mean_tpot_s * 1e3, rel=1e-9)
    assert mean([r.e2el_ms for r in rows]) == pytest.approx(plain.mean_latency_s * 1e3, rel=1e-9)
    assert recorded.summary() | {"wall_seconds": 0} == plain.summary() | {"wall_seconds": 0, "config": recorded.summary()["config"]}


@pytest.fixture(scope="module")
def head_of_line_run(tiny_llama_dir):
    """A long prompt before three short ones, chunked prefill with a 32-token budget, run to its end."""
    from engine import EngineConfig, LLMEngine, SamplingParams

    llm = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=64, enable_chunked_prefill=True, max_num_batched_tokens=32))
    for prompt in (LONG, *SHORTS):
        llm.add_request(prompt, SamplingParams(max_tokens=4, ignore_eos=True))
    reports = []
    while llm.has_unfinished_requests():
        reports.append(llm.step())
    return llm, reports


def test_a_real_runs_timeline_shows_the_long_prefill_blocking_the_queue(head_of_line_run):
    llm, reports = head_of_line_run
    rows = build_timeline(reports)
    assert [r.request_id for r in rows] == [0, 1, 2, 3]
    long = rows[0]
    chunks = [s for s in long.spans if s.state == PREFILL]
    prompt = len(llm.get_output(0).prompt_token_ids)
    assert len(chunks) == -(-prompt // 32) and [c.computed for c in chunks][-1] == prompt == chunks[0].prompt_tokens
    assert all(s.state == DECODE for s in long.spans[len(chunks):])
    first_short = rows[1].spans[0]  # waits behind the long prompt's first chunk, the whole budget
    assert (first_short.state, first_short.reason, first_short.largest_prefill, first_short.largest_prefill_tokens) == (WAITING, "budget", 0, 32)
    assert rows[2].spans[0].reason == "queue" and rows[2].spans[0].blocker == 1
    from visualize.timeline import span_texts

    assert span_texts(first_short, "en")[1] == "behind a long prefill: request 0 prefills 32 of the step's 32 tokens"
    assert span_texts(first_short, "zh")[1] == "排在长预填充之后：请求 0 预填充了本步 32 个 token 中的 32 个"
    for row in rows:  # every request's latencies, by bench-serve's definitions, from the step durations alone
        ends = [end for _, end in step_times(reports)]
        token_steps = [r.step for r in reports if r.new_token_ids.get(row.request_id)]
        assert row.arrival_ms == 0.0 and row.output_tokens == 4 == len(llm.get_output(row.request_id).token_ids)
        assert row.ttft_ms == pytest.approx(sum(r.timings_ms["total"] for r in reports[: token_steps[0] + 1]))
        assert row.e2el_ms == pytest.approx(ends[token_steps[-1]])
        assert row.tpot_ms == pytest.approx((row.e2el_ms - row.ttft_ms) / 3)
    assert rows[1].first_token_step >= chunks[-1].step  # it waited for every chunk of the long prompt


def test_a_saved_run_replays_into_the_same_timeline(head_of_line_run, tmp_path):
    from engine.runfile import Run, Workload, WorkloadRequest, load_run, run_json

    llm, reports = head_of_line_run
    run = Run(Workload([WorkloadRequest(p, 4) for p in (LONG, *SHORTS)]),
              dict(model_name="tiny", block_size=16, num_blocks=64, bytes_per_slot=llm.bytes_per_slot),
              {i: p for i, p in enumerate((LONG, *SHORTS))}, reports)
    path = tmp_path / "run.json"
    path.write_text(run_json(run), encoding="utf-8")
    assert build_timeline(load_run(path).steps) == build_timeline(reports)
    # A run file written before the reports said when requests arrived and why they waited: steps laid
    # end to end by their durations; a request appears at the first step that schedules it.
    older = build_timeline([dataclasses.replace(r, waiting={}, start_ms=None, arrived={}) for r in reports])
    now = build_timeline(reports)
    assert (older[0].ttft_ms, older[0].e2el_ms) == pytest.approx((now[0].ttft_ms, now[0].e2el_ms))
    for old, new in zip(older[1:], now[1:]):
        first = next(s for s in new.spans if s.state == PREFILL)
        assert old.arrival_ms == pytest.approx(first.start_ms) and old.end_ms == pytest.approx(new.end_ms)


def test_a_request_added_between_steps_arrives_on_the_engines_clock(tiny_llama_dir):
    from engine import EngineConfig, LLMEngine, SamplingParams

    llm = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=32, max_num_seqs=1))
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    llm.add_request("Hello there.", params)
    reports = [llm.step(), llm.step()]
    llm.add_request("Name three fruits.", params)  # arrives after two steps; max_num_seqs = 1: it waits
    while llm.has_unfinished_requests():
        reports.append(llm.step())
    late = build_timeline(reports)[1]
    assert late.arrival_ms == pytest.approx(reports[0].timings_ms["total"] + reports[1].timings_ms["total"])
    assert late.arrival_step == 2 and late.spans[0].state == WAITING and late.spans[0].reason == "max_num_seqs"
    assert reports[2].start_ms == pytest.approx(late.arrival_ms)


def test_latencies_are_bench_serves(head_of_line_run):
    """The page's summary is bench-serve's own calculate_metrics over the timeline's requests."""
    from visualize.timeline import bench_serve_summary

    rows = build_timeline(head_of_line_run[1])
    summary = bench_serve_summary(rows)
    assert summary["completed"] == 4
    assert summary["mean_ttft_ms"] == pytest.approx(sum(r.ttft_ms for r in rows) / 4)
    e2el = sorted(r.e2el_ms for r in rows)
    assert summary["median_e2el_ms"] == pytest.approx((e2el[1] + e2el[2]) / 2)
    assert summary["mean_tpot_ms"] == pytest.approx(sum(r.tpot_ms for r in rows) / 4)


def trace_event_problems(trace: dict) -> list[str]:
    """What does not follow the Trace Event Format (JSON object form): the required keys and their
    types for each phase used, complete events' non-negative ``dur``, and names for every track."""
    problems = []
    if not isinstance(trace.get("traceEvents"), list):
        return ["no traceEvents list"]
    required = {"X": ("name", "ph", "pid", "tid", "ts", "dur"), "M": ("name", "ph", "pid", "args"), "i": ("name", "ph", "pid", "tid", "ts", "s")}
    for i, event in enumerate(trace["traceEvents"]):
        ph = event.get("ph")
        if ph not in required:
            problems.append(f"event {i}: phase {ph!r} is not one of X, M, i")
            continue
        problems += [f"event {i}: no {key!r}" for key in required[ph] if key not in event]
        if not isinstance(event.get("name"), str) or not isinstance(event.get("pid"), int) or not isinstance(event.get("tid", 0), int):
            problems.append(f"event {i}: name must be a string, pid and tid integers")
        for key in ("ts", "dur"):
            if key in event and (not isinstance(event[key], (int, float)) or event[key] < 0):
                problems.append(f"event {i}: {key} must be a number >= 0 (µs)")
        if ph == "M" and event["name"] not in ("process_name", "thread_name", "thread_sort_index", "process_sort_index"):
            problems.append(f"event {i}: unknown metadata {event['name']!r}")
        if ph == "i" and event.get("s") not in ("g", "p", "t"):
            problems.append(f"event {i}: instant scope must be g, p or t")
    return problems


def tracks(trace: dict) -> tuple[dict[int, str], set[int]]:
    """(tid -> thread name, tids that hold slices)."""
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    return names, {e["tid"] for e in trace["traceEvents"] if e["ph"] == "X"}


def test_generate_writes_a_chrome_trace_of_a_real_run(tiny_llama_dir, tmp_path, capsys):
    from engine.cli import main

    out = tmp_path / "trace.json"
    main(["generate", "--model", str(tiny_llama_dir), "--max-tokens", "3", "--quiet", "--chrome-trace", str(out), LONG, *SHORTS])
    trace = json.loads(out.read_text(encoding="utf-8"))
    assert trace_event_problems(trace) == []
    names, with_slices = tracks(trace)
    assert names == {i: f"request {i}" for i in range(4)} and with_slices == set(names)  # one track per request
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == 0]
    assert [e["name"] for e in slices][:1] == ["prefill"] and slices[-1]["name"] == "decode"
    assert all(b["ts"] >= a["ts"] + a["dur"] - 1e-3 for a, b in zip(slices, slices[1:]))  # one slice per step, in order


def test_simulate_writes_a_chrome_trace(tmp_path):
    from engine.sim.simulator import main

    out = tmp_path / "sim.json"
    main(["simulate", "--num-requests", "6", "--kv-slots", "4000", "--cost-model", "a100-opt-13b", "--request-rate", "4", "--json",
          "--chrome-trace", str(out)])
    trace = json.loads(out.read_text(encoding="utf-8"))
    assert trace_event_problems(trace) == []
    names, with_slices = tracks(trace)
    assert sorted(names) == list(range(6)) and with_slices == set(names)
    arrivals = sorted(e["ts"] for e in trace["traceEvents"] if e["ph"] == "i" and e["name"] == "arrival")
    assert len(arrivals) == 6 and arrivals[-1] > 0  # Poisson arrivals on the simulated clock


def test_the_trace_and_the_chart_agree_on_the_spans(head_of_line_run):
    from visualize.timeline import timeline_frame

    reports = head_of_line_run[1]
    frame = timeline_frame(build_timeline(reports), "zh")
    slices = [e for e in chrome_trace(reports)["traceEvents"] if e["ph"] == "X"]
    assert len(frame) == len(slices)
    assert set(frame["request"]) == {f"请求 {i}" for i in range(4)} and "预填充" in set(frame["state_label"])


def test_a_long_run_is_drawn_with_one_bar_per_stretch_of_equal_steps():
    """Thousands of step spans are merged into stretches for the chart; every step stays covered once."""
    from visualize.timeline import MAX_BARS, coalesce, timeline_chart, timeline_frame

    reports = simulate(num_requests=16, kv_slots=4000, max_model_len=1024, cost_model="a100-opt-13b", record_steps=True).step_reports
    rows = build_timeline(reports)
    frame = timeline_frame(rows)
    merged = coalesce(frame)
    assert len(frame) > MAX_BARS > len(merged)
    for rid, group in merged.groupby("request_id"):
        own = frame[frame["request_id"] == rid]
        assert group["start"].iloc[0] == own["start"].iloc[0] and group["end"].iloc[-1] == own["end"].iloc[-1]
        assert group["start"].iloc[1:].to_numpy() == pytest.approx(group["end"].iloc[:-1].to_numpy())  # no gap, no overlap
    datasets = timeline_chart(rows).to_dict()["datasets"].values()
    assert max(len(values) for values in datasets) == len(merged)  # the chart draws the stretches


def test_the_trace_is_strict_json_and_refuses_a_time_that_is_not_finite(head_of_line_run):
    from engine.timeline import chrome_trace_json

    reports = head_of_line_run[1]
    assert json.loads(chrome_trace_json(reports)) == chrome_trace(reports)
    broken = [dataclasses.replace(reports[0], start_ms=float("inf")), *reports[1:]]
    with pytest.raises(ValueError, match="Out of range float"):  # never "ts": Infinity, which no trace viewer opens
        chrome_trace_json(broken)


def test_the_simulators_head_of_line_demo_shows_chunked_prefill_protecting_running_decodes():
    """The Paged vs contiguous page's demo: eight short requests are decoding when a 1,500-token prompt
    arrives. With whole prompts its prefill stalls their decodes (their longest ITL spikes); chunked prefill
    keeps decoding them (the longest ITL falls), at a slightly later first token for the long prompt; the
    caption states it with the runs' own numbers, in English and 中文."""
    from app_pages.compare import LONG_ARRIVAL_S, _head_of_line_steps, decode_stall_numbers
    from visualize.i18n import t
    from visualize.timeline import latency_rows

    whole, chunked = _head_of_line_steps(False), _head_of_line_steps(True)
    rows = latency_rows(build_timeline(whole))
    long, short = rows[-1], rows[:-1]
    assert long["arrival_ms"] == LONG_ARRIVAL_S * 1000 and all(r["ttft_ms"] < long["arrival_ms"] < r["e2el_ms"] for r in short), \
        "the short requests are decoding when the long prompt arrives"
    n = decode_stall_numbers(whole, chunked)
    assert n["itl_whole"] == f"{max(r['itl_max_ms'] for r in short):.0f}", "the latency table's longest ITL column"
    assert float(n["itl_chunked"]) < float(n["itl_whole"]) / 2
    assert float(n["ttft_chunked"]) >= float(n["ttft_whole"])
    en, zh = t("sim_timeline_conclusion", "en", **n), t("sim_timeline_conclusion", "zh", **n)
    assert f"their longest gap falls to {n['itl_chunked']} ms" in en and f"最长间隔降到 {n['itl_chunked']} 毫秒" in zh


def test_the_simulator_records_whom_lpm_passed_over():
    """Longest prefix match on the simulator: a request that shares nothing, queued before two that share a
    cached prefix, waits for "lpm_passed_over" while they go first, and its timeline names who passed it."""
    from engine.report import WAIT_LPM_PASSED_OVER
    from engine.sim.simulator import simulate
    from engine.sim.workloads import Request

    shared = list(range(100, 164))
    out = [7, 7, 7, 7]
    requests = [Request(0.0, 64, 4, tuple(shared + out)), Request(0.0, 64, 4, tuple(range(300, 364)) + tuple(out)),
                Request(0.0, 68, 4, tuple(shared + [1, 2, 3, 4] + out))]
    result = simulate(requests=requests, kv_slots=16 * 40, max_model_len=128, max_num_seqs=1, enable_prefix_caching=True, scheduling_policy="lpm",
                      record_steps=True)
    passed = [r for r in result.step_reports if r.passed_over]
    assert passed and passed[0].passed_over == {1: 2} and passed[0].waiting[1] == WAIT_LPM_PASSED_OVER
    spans = [s for row in build_timeline(result.step_reports) if row.request_id == 1 for s in row.spans if s.reason == WAIT_LPM_PASSED_OVER]
    assert spans[0].blocker == 2 and spans[0].blocker_cached == 64
