"""The Live page with speculative decoding (the n-gram preset, the default model, greedy): the
acceptance counters, the pool map's tentative and rolled-back slots, the event log, in English and
Chinese, and a saved run that replays them."""

from __future__ import annotations

import json

import paged_kernels  # noqa: F401, I001 - before anything imports Triton (see tests/test_app.py)
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from app_pages.state import MODEL_ENV
from app_pages.saved import current_workload
from app_pages.state import clean_workload
from engine.runfile import Run, load_run, run_json
from visualize.i18n import t
from visualize.pool import event_log_rows, pool_blocks, pool_map_figure

APP = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "app.py")


def pool_rows(at: AppTest) -> list[dict]:
    """The pool map's data rows, as the browser gets them (Streamlit sends the data apart, as Arrow)."""
    for chart in at.get("vega_lite_chart"):
        if chart.proto.HasField("data"):
            rows = pa.ipc.open_stream(chart.proto.data.data).read_pandas().to_dict("records")
            if rows and "tentative_count" in rows[0]:
                return rows
    raise AssertionError("no pool map on the page")


def legend(at: AppTest) -> str:
    return "".join(m.value for m in at.markdown if "pool-legend" in m.value)


@pytest.fixture(scope="module")
def stepped(default_model_dir, cpu_kernels_built):
    """The preset, loaded in English, stepped one step at a time until a step has rejected a draft
    (at most 8 steps): the AppTest and, per step, the pool rows and legend the page showed."""
    mp = pytest.MonkeyPatch()
    mp.delenv(MODEL_ENV, raising=False)
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    at.selectbox(key="preset__en").set_value("preset_speculative").run()
    next(b for b in at.button if b.label == "Load preset").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["settings"].num_speculative_tokens == 4 and at.session_state["settings"].temperature == 0.0
    shown = []
    for _ in range(8):
        at.button(key="btn_step").click().run()
        assert not at.exception, [e.value for e in at.exception]
        report = at.session_state["reports"][-1]
        shown.append((report, pool_rows(at), legend(at), {m.label: m.value for m in at.metric}))
        if any(o.rolled_back_slots for o in report.spec.values()):
            break
    yield at, shown
    mp.undo()


def test_the_preset_speculates_and_the_pool_map_shows_tentative_and_given_back_slots(stepped):
    at, shown = stepped
    report, rows, text, metrics = shown[-1]
    assert report.spec, "a step with proposals"
    assert any(o.accepted > 0 for r, *_ in shown for o in r.spec.values()), "the model accepts some drafts"
    bs = at.session_state["settings"].block_size
    tentative = {s for o in report.spec.values() for s in o.tentative_slots}
    rolled = {s for o in report.spec.values() for s in o.rolled_back_slots}
    assert rolled and rolled <= tentative
    # the chart's rows: every block with a draft has its tentative count, the given-back ones outlined
    by_block = {r["block"]: r for r in rows}
    for b in {s // bs for s in tentative}:
        assert by_block[b]["tentative_count"] == sum(1 for s in tentative if s // bs == b)
    for b in {s // bs for s in rolled}:
        row = by_block[b]
        assert row["rolled_back_count"] == sum(1 for s in rolled if s // bs == b)
        first = min(s % bs for s in rolled if s // bs == b)
        assert row["rolled_back_x"] == pytest.approx(row["col"] + 0.9 * first / bs)
    assert all(r["tentative_count"] == 0 for r in rows if r["block"] not in {s // bs for s in tentative})
    assert t("legend_tentative", "en") in text and t("legend_rolled_back", "en") in text
    # the counters: the step's acceptance rate and accepted length, as the report has them
    assert metrics["Acceptance rate"] == f"{report.spec_acceptance_rate:.0%}"
    assert metrics["Mean accepted length"] == f"{report.spec_mean_accepted_length:.2f}"
    # Tokens processed: the step's query tokens, 1 + drafts per verifying request (10 for the two at k = 4)
    writes = sum(1 for e in report.events if e.kind == "write")
    assert int(metrics["Tokens processed"]) == writes == sum(1 + len(o.proposed) for o in report.spec.values()) + sum(
        1 for s in report.scheduled if s.request_id not in report.spec)
    html = "".join(m.value for m in at.markdown if "request-spec" in m.value)
    o = next(iter(report.spec.values()))
    assert f"acceptance rate (accepted ÷ proposed) {o.acceptance_rate:.0%}" in html and f"{o.mean_accepted_length:.2f} tokens per step" in html
    # the event log: a row per draft, in words
    events = at.dataframe[-1].value
    assert {"propose draft", "reject draft"} <= set(events[t("event_kind", "en")])
    assert any(f"slot {s}" in d and "given back" in d for d in events[t("event_detail", "en")] for s in rolled)


def test_chinese_counters_legend_and_events(stepped):
    at, shown = stepped
    report = shown[-1][0]
    at.radio(key="lang").set_value("zh").run()
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["接受率"] == f"{report.spec_acceptance_rate:.0%}" and metrics["平均接受长度"] == f"{report.spec_mean_accepted_length:.2f}"
    assert "浅色虚线" in legend(at) and "橙色虚线框" in legend(at)
    rows = pool_rows(at)
    assert any(r["rolled_back_count"] for r in rows) and any("已归还" in r["spec_text"] for r in rows)
    events = at.dataframe[-1].value
    assert {"提出草稿", "拒绝草稿"} <= set(events[t("event_kind", "zh")])
    assert any("已归还" in d for d in events[t("event_detail", "zh")])
    at.radio(key="lang").set_value("en").run()


def test_a_saved_run_carries_what_the_pool_map_draws(stepped):
    at, shown = stepped
    reports = at.session_state["reports"]
    bs = at.session_state["settings"].block_size
    num_blocks = reports[-1].memory.capacity // bs
    workload = current_workload(at.session_state["settings"], clean_workload(at.session_state["workload_df"]))
    run = Run(workload, dict(model_name="m", block_size=bs, num_blocks=num_blocks, bytes_per_slot=1), {}, reports)
    back = load_run(run_json(run).encode(), name="spec.json")
    for a, b in zip(reports, back.steps):
        assert pool_blocks(a, bs) == pool_blocks(b, bs)
        assert event_log_rows(a, "zh") == event_log_rows(b, "zh")
        assert (a.spec_acceptance_rate, a.spec_mean_accepted_length) == (b.spec_acceptance_rate, b.spec_mean_accepted_length)
    assert any(b["rolled_back"] for b in pool_blocks(back.steps[-1], bs))
    assert back.workload.settings["num_speculative_tokens"] == 4  # opening the file sets the sidebar's k again
    # the slide figure (matplotlib) of the replayed step: its legend names both marks, in Chinese
    fig = pool_map_figure(back.steps[-1], bs, "zh")
    labels = [x.get_text() for x in fig.axes[0].get_legend().get_texts()]
    assert t("legend_tentative", "zh") in labels and t("legend_rolled_back", "zh") in labels
    json.loads(run_json(run))
