"""The app's swap and chunked-prefill controls and views, driven headless (streamlit.testing) on the
tiny random Llama: what a student reads — the CPU swap space's map and its marked copies, the queues,
the event log, a chunked prompt's progress bar, the sidebar's controls — in English and Chinese."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from tests.test_app_sharing import app  # noqa: F401 (the fixture: the app on the tiny random Llama)
from tests.test_app_sharing import load as load_preset
from app_pages.swap_panel import request_ids_text
from visualize.i18n import t, untranslated


def load(at: AppTest, preset: str, lang: str) -> None:
    if lang == "zh":
        at.radio(key="lang").set_value("zh").run()
    load_preset(at, preset, lang)


def run_steps(at: AppTest, n: int) -> None:
    at.number_input(key="n_steps").set_value(n).run()
    at.button(key="btn_run").click().run()
    assert not at.exception, [e.value for e in at.exception]


def pool_specs(at: AppTest) -> list[dict]:
    """Each Vega-Lite chart's spec, with its data (sent beside the spec, as Arrow) back in ``values``."""
    specs = []
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        if chart.proto.data.data:
            spec["values"] = pa.ipc.open_stream(chart.proto.data.data).read_pandas().to_dict(orient="records")
        specs.append(spec)
    return specs


def captions(at: AppTest) -> list[str]:
    return [c.value for c in at.main.caption]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_swap_preset_swaps_and_both_maps_show_the_copies(app: AppTest, lang: str):
    load(app, "preset_swap", lang)
    assert app.radio(key=f"preemption_mode__{lang}").value == "swap"
    engine = app.session_state["engine"]
    assert engine.config.preemption_mode == "swap" and engine.num_blocks == 18
    for _ in range(30):  # step until a step swaps a request out
        run_steps(app, 1)
        report = app.session_state["reports"][-1]
        if report.blocks_to_swap_out:
            break
    assert report.blocks_to_swap_out, "the preset's 18 blocks force a swap within 30 steps"
    g, c = report.blocks_to_swap_out[0]
    specs = pool_specs(app)
    cpu = next(s for s in specs if s.get("description") == t("cpu_pool", lang))
    gpu = specs[0]
    assert t("cpu_pool", lang) in [m.value.strip("*") for m in app.markdown]
    cpu_cells = {r["block"]: r for r in cpu["values"]}
    gpu_cells = {r["block"]: r for r in gpu["values"]}
    assert len(cpu_cells) == 18, "a swap space as large as the pool"
    assert cpu_cells[c]["swap_text"] == t("swap_cpu_out", lang, block=g)
    swapped = report.swapped_out[0]
    holder = {b: s.request_id for s in report.block_tables for b in s.block_table}
    if g in holder:  # handed to another request in the same step: the tooltip names both owners
        assert gpu_cells[g]["swap_text"] == t("swap_gpu_out_reused", lang, block=c, old=swapped, new=holder[g])
    else:
        assert gpu_cells[g]["swap_text"] == t("swap_gpu_out", lang, block=c)
    assert cpu_cells[c]["owner_text"] == f"{t('request', lang)} {swapped}"
    # the queues line names the swapped request; the caption counts the copies
    line = next(x for x in captions(app) if x.startswith(t("queues_line", lang, waiting="", running="")[:4]))
    assert line.endswith(t("queues_swapped", lang, swapped=request_ids_text(report.swapped, lang)))  # "request 3", not a count
    assert any(t("cpu_pool_caption", lang, out=len(report.blocks_to_swap_out), inn=0, ms=0)[:20] in x for x in captions(app))
    # the step summary counts the third queue, and the request list says who is swapped out
    summary = next(x for x in captions(app) if t("running_waiting_swapped", lang) in x)
    assert summary.split(t("sep_colon", lang))[-1].split(" / ")[2] == str(len(report.swapped))
    page = " ".join(m.value for m in app.markdown)
    assert page.count(t("status_swapped", lang)) >= len(report.swapped)
    events = app.dataframe[-1].value
    assert (events[t("event_kind", lang)] == t("ev_swap_out", lang)).sum() == len(report.blocks_to_swap_out)
    assert t("ev_preempt_swap_detail", lang) in set(events[t("event_detail", lang)])
    if lang == "zh":
        assert not untranslated(" ".join(captions(app)) + " ".join(events[t("event_detail", lang)]))
    for _ in range(12):  # a short request finishes and a swapped one comes back in (teal on both maps)
        run_steps(app, 1)
        report = app.session_state["reports"][-1]
        if report.blocks_to_swap_in:
            break
    assert report.blocks_to_swap_in and report.swapped_in
    c, g = report.blocks_to_swap_in[0]
    specs = pool_specs(app)
    cpu = next(s for s in specs if s.get("description") == t("cpu_pool", lang))
    assert {r["block"]: r for r in specs[0]["values"]}[g]["swap_text"] == t("swap_gpu_in", lang, block=c)
    assert {r["block"]: r for r in cpu["values"]}[c]["swap_text"] == t("swap_cpu_in", lang, block=g)
    events = app.dataframe[-1].value
    assert (events[t("event_kind", lang)] == t("ev_swap_in", lang)).sum() == len(report.blocks_to_swap_in)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_chunked_prefill_preset_shows_the_long_prompts_progress(app: AppTest, lang: str):
    load(app, "preset_chunked_prefill", lang)
    assert app.toggle(key="chunked_prefill").value is True
    engine = app.session_state["engine"]
    assert engine.config.enable_chunked_prefill and engine.config.max_num_batched_tokens == 48
    run_steps(app, 2)  # step 1: the last chunk of request 1, the first of the long prompt (request 2)
    long_prompt = len(engine.get_output(2).prompt_token_ids)
    report = app.session_state["reports"][-1]
    row = next(s for s in report.scheduled if s.request_id == 2)
    done = row.num_computed_tokens  # with the chat template's prefix found in the prefix cache, more than the chunk
    assert 0 < row.num_tokens <= done < long_prompt and report.num_tokens <= 48
    bars = {b.proto.text: b.proto.value for b in app.get("progress")}
    text = t("prefill_progress_bar", lang, request=2, computed=done, total=long_prompt, chunk=row.num_tokens)
    assert bars.get(text) == int(100 * done / long_prompt), (text, bars)
    assert t("prefill_progress", lang) in [m.value.strip("*") for m in app.markdown]
    for _ in range(8):  # until the long prompt's last chunk: its bar full
        run_steps(app, 1)
        report = app.session_state["reports"][-1]
        if any(s.request_id == 2 and s.phase == "decode" for s in report.scheduled):
            break
        row = next(s for s in report.scheduled if s.request_id == 2)
        if row.num_computed_tokens == long_prompt:
            break
    bars = {b.proto.text: b.proto.value for b in app.get("progress")}
    last = next(s for s in report.scheduled if s.request_id == 2)
    assert bars[t("prefill_progress_bar", lang, request=2, computed=long_prompt, total=long_prompt, chunk=last.num_tokens)] == 100
    assert all(r.num_tokens <= 48 for r in app.session_state["reports"])
    assert all(any(s.phase == "decode" for s in r.scheduled) for r in app.session_state["reports"][1:]), \
        "the short requests decode in every step while the long prompt is chunked"


def test_sidebar_controls_reach_the_engine_and_a_too_small_budget_is_moved_up(app: AppTest):
    app.radio(key="preemption_mode__en").set_value("swap").run()
    assert app.session_state["engine"].config.preemption_mode == "swap"
    app.toggle(key="chunked_prefill").set_value(True).run()
    app.number_input(key="token_budget__input").set_value(3).run()  # below the max batch of 8
    assert not app.exception, [e.value for e in app.exception]
    assert app.session_state["engine"].config.max_num_batched_tokens == 8
    assert any("8" in w.value and "3" in w.value for w in app.sidebar.warning), "a note says what was typed and what is used"
    assert app.sidebar.toggle(key="chunked_prefill").help == t("chunked_prefill_help", "en")
    app.radio(key="allocator__en").set_value("contiguous").run()  # swap needs blocks: recompute, and the sidebar says so
    assert not app.exception, [e.value for e in app.exception]
    assert app.session_state["engine"].config.preemption_mode == "recompute"
    assert t("preemption_contiguous_note", "en") in [c.value for c in app.sidebar.caption]
