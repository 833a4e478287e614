"""The CPU pool lane and the chunked-prefill progress (visualize/swap.py), from real engine runs on the
tiny random Llama: what the app draws must agree with what the engine reports, block for block."""

from __future__ import annotations

import json

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.report import SWAP_IN, SWAP_OUT
from visualize.i18n import t, untranslated
from visualize.pool import event_log_rows, pool_map_spec
from visualize.swap import cpu_pool_blocks, cpu_pool_map_spec, gpu_swap_spec, prefill_progress, queues, swap_marks


def run(engine, prompts, max_tokens):
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    reports = []
    while engine.has_unfinished_requests():
        reports.append(engine.step())
    return reports


@pytest.fixture(scope="module")
def swap_reports(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=12, preemption_mode="swap"))
    return run(engine, [list(range(5 + i, 11 + i)) for i in range(4)], 14)


def test_the_cpu_lane_shows_the_swapped_requests_blocks_and_the_steps_copies(swap_reports):
    out_steps = [r for r in swap_reports if r.blocks_to_swap_out]
    in_steps = [r for r in swap_reports if r.blocks_to_swap_in]
    assert out_steps and in_steps, "the pool of 12 blocks of 4 forces a swap out and back in"
    for report in swap_reports:
        blocks = cpu_pool_blocks(report, 4)
        assert len(blocks) == report.cpu_memory.capacity // 4 == 12, "the swap space is as large as the GPU pool"
        held = {b for snap in report.cpu_block_tables for b in snap.block_table}
        assert {b["block"] for b in blocks if b["owner"] is not None} == held
        assert {b["owner"] for b in blocks if b["owner"] is not None} == set(report.swapped)
        # the marks are the step's copies, both ways, and agree with the SWAP_OUT / SWAP_IN events
        marks = swap_marks(report)
        events = {(e.kind, e.block_id, e.dst_block_id) for e in report.events if e.kind in (SWAP_OUT, SWAP_IN)}
        assert events == {(SWAP_OUT, g, c) for g, c in report.blocks_to_swap_out} | {(SWAP_IN, c, g) for c, g in report.blocks_to_swap_in}
        assert {b["block"]: (b["swap"], b["partner"]) for b in blocks if b["swap"]} == marks["cpu"]
        for g, c in report.blocks_to_swap_out:
            assert marks["gpu"][g] == ("out", c) and marks["cpu"][c] == ("out", g)
    report = out_steps[0]
    g, c = report.blocks_to_swap_out[0]
    assert next(b for b in cpu_pool_blocks(report, 4) if b["block"] == c)["owner"] == report.swapped_out[0], \
        "the CPU block a request was swapped to is drawn in that request's colour"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_both_maps_mark_the_copies_and_name_the_other_end(swap_reports, lang):
    report = next(r for r in swap_reports if r.blocks_to_swap_out)
    g, c = report.blocks_to_swap_out[0]
    gpu = {r["block"]: r for r in gpu_swap_spec(pool_map_spec(report, 4, lang), report, lang)["data"]["values"]}
    cpu_spec = cpu_pool_map_spec(report, 4, lang)
    cpu = {r["block"]: r for r in cpu_spec["data"]["values"]}
    holder = {b: s.request_id for s in report.block_tables for b in s.block_table}
    swapped = {cb: s.request_id for s in report.cpu_block_tables for cb in s.block_table}
    if g in holder:  # handed to another request in the same step: the tooltip names both
        assert gpu[g]["swap_text"] == t("swap_gpu_out_reused", lang, block=c, old=swapped[c], new=holder[g])
    else:
        assert gpu[g]["swap_text"] == t("swap_gpu_out", lang, block=c)
    assert gpu[g]["swap"] == "out"
    assert cpu[c]["swap"] == "out" and cpu[c]["swap_text"] == t("swap_cpu_out", lang, block=g)
    assert cpu_spec["description"] == t("cpu_pool", lang)
    outlines = {layer["transform"][0].get("filter"): layer["mark"] for layer in cpu_spec["layer"] if layer.get("transform")}
    assert outlines["datum.swap == 'out'"]["strokeDash"] == [6, 3], "swapped out: dashed, as the caption says"
    assert outlines["datum.swap == 'in'"]["strokeDash"] == [1, 0], "swapped in: solid"

    assert report.prefix_cache is not None and t("mark_hit", lang) in json.dumps(pool_map_spec(report, 4, lang), ensure_ascii=False)
    assert t("mark_hit", lang) not in json.dumps(cpu_spec, ensure_ascii=False), "the CPU pool caches nothing: no cache-hit legend"
    rows = event_log_rows(report, lang)
    swap_rows = [r for r in rows if r["kind"] == SWAP_OUT]
    assert len(swap_rows) == len(report.blocks_to_swap_out)
    assert swap_rows[0]["event"] == t("ev_swap_out", lang) and f"{g}" in swap_rows[0]["detail"] and f"{c}" in swap_rows[0]["detail"]
    preempt = next(r for r in rows if r["kind"] == "preempt")
    assert preempt["detail"] == t("ev_preempt_swap_detail", lang)
    if lang == "zh":
        assert not untranslated(" ".join(r["detail"] + r["event"] for r in rows))


def test_a_block_swapped_out_and_reused_in_the_same_step_names_both_owners(swap_reports):
    reused = [(r, g, c) for r in swap_reports for g, c in r.blocks_to_swap_out
              if g in {b for s in r.block_tables for b in s.block_table}]
    assert reused, "the swap preset's run must swap a block out and hand it to another request in one step"
    report, g, c = reused[0]
    gpu = {r["block"]: r for r in gpu_swap_spec(pool_map_spec(report, 4), report)["data"]["values"]}
    assert "then the block was given to request" in gpu[g]["swap_text"]


def test_the_three_queues_partition_the_unfinished_requests(swap_reports):
    ids = sorted({s.request_id for r in swap_reports for s in r.scheduled})
    finished: set[int] = set()
    seen_swapped = False
    for report in swap_reports:
        q = queues(report, ids, finished)
        finished |= set(report.finished)
        together = q["waiting"] + q["running"] + q["swapped"]
        assert sorted(together) == sorted(set(ids) - finished), "every unfinished request in exactly one queue"
        assert q["swapped"] == sorted(report.swapped)
        seen_swapped |= bool(q["swapped"])
    assert seen_swapped


def test_a_chunked_prompt_shows_its_progress_and_the_decodes_run_beside_it(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=64, enable_chunked_prefill=True,
                                    max_num_batched_tokens=16, max_num_seqs=4))
    engine.add_request(list(range(5, 10)), SamplingParams(max_tokens=12, ignore_eos=True))
    reports = [engine.step()]
    engine.add_request(list(range(20, 70)), SamplingParams(max_tokens=2, ignore_eos=True))  # 50 tokens, budget 16
    while engine.has_unfinished_requests():
        reports.append(engine.step())
    rows = [(i, row) for i in range(len(reports)) for row in prefill_progress(reports[i], reports[i - 1] if i else None)]
    long_rows = [row for _, row in rows if row["request_id"] == 1]
    assert [row["computed"] for row in long_rows] == [15, 30, 45, 50], "15 tokens a step (one goes to the decode), then the rest"
    assert all(row["total"] == 50 for row in long_rows) and long_rows[-1]["done"] and long_rows[-1]["fraction"] == 1.0
    assert [row["fraction"] for row in long_rows] == sorted(row["fraction"] for row in long_rows)
    for i, _ in rows:  # every step that chunked the long prompt decoded the short request too
        assert any(s.request_id == 0 and s.phase == "decode" for s in reports[i].scheduled)
        assert reports[i].num_tokens <= 16
    assert not prefill_progress(reports[0]), "a prompt prefilled whole in one step has no progress bar"


def test_a_saved_run_keeps_the_cpu_lane_and_a_workload_its_scheduler_settings(swap_reports):
    from engine.runfile import Run, Workload, WorkloadRequest, load_any, load_run, run_json, workload_json

    workload = Workload([WorkloadRequest("Hi", 4)], settings=dict(preemption_mode="swap", enable_chunked_prefill=True,
                                                                 max_num_batched_tokens=48))
    back = load_any(workload_json(workload).encode(), "workload.json").settings
    assert (back["preemption_mode"], back["enable_chunked_prefill"], back["max_num_batched_tokens"]) == ("swap", True, 48)
    saved = Run(workload, dict(model_name="tiny", block_size=4, num_blocks=12, bytes_per_slot=1), {}, swap_reports)
    steps = load_run(run_json(saved).encode(), "run.json").steps
    for report, reread in zip(swap_reports, steps):
        assert cpu_pool_blocks(reread, 4) == cpu_pool_blocks(report, 4)
        assert swap_marks(reread) == swap_marks(report) and reread.swapped == report.swapped
