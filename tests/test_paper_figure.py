"""visualize/paper.py: the Figure 2 bars keep free memory apart, draw the paper's marks on the share of
the memory in use (the paper's measure), speak Chinese."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_hex

from engine.core.accounting import CATEGORIES
from visualize.colors import CATEGORY_COLORS
from visualize.i18n import t, untranslated
from visualize.paper import figure_texts, plot_memory_breakdown, share_metrics

# A paged run on a half-empty pool: 10% token states, 1% internal fragmentation, the rest free.
ROWS = [
    dict(workload="engine", system="paged", token_state_fraction=0.10, paper_token_state_fraction=0.963,
         fragmentation=dict(token_states=0.10, reserved=0.0, internal_fragmentation=0.01, external_fragmentation=0.0, free=0.89)),
    dict(workload="engine", system="contiguous (max)", token_state_fraction=0.05, paper_token_state_fraction=0.204,
         fragmentation=dict(token_states=0.05, reserved=0.3, internal_fragmentation=0.4, external_fragmentation=0.05, free=0.2)),
]


def segments(fig, panel: int = 0) -> dict[str, list[tuple[str, float]]]:
    """Per legend label: (colour, length in %) of its bars in one panel (0: the pool, 1: memory in use)."""
    ax = fig.axes[panel]
    out = {}
    for container in ax.containers:
        out[container.get_label()] = [(to_hex(p.get_facecolor()), p.get_width()) for p in container.patches]
    return out


def test_free_memory_is_its_own_grey_segment_not_fragmentation():
    fig = plot_memory_breakdown(ROWS)
    bars = segments(fig)
    assert list(bars) == [t(c) for c in CATEGORIES[:-1]] + [t("fig2_free")]
    free = bars[t("fig2_free")]
    assert [round(h, 6) for _, h in free] == [89.0, 20.0]
    assert {c for c, _ in free} == {CATEGORY_COLORS["free"]}
    external = [h for _, h in bars[t("external_fragmentation")]]
    assert [round(h, 6) for h in external] == [0.0, 5.0]  # paged external fragmentation stays 0
    plt.close(fig)


def test_the_papers_marks_are_drawn_with_their_values():
    fig = plot_memory_breakdown(ROWS)
    ax = fig.axes[1]
    dashed = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert sorted(round(line.get_xdata()[0], 6) for line in dashed) == [20.4, 96.3]
    texts = figure_texts(fig)
    assert "paper 96.3%" in texts and "paper 20.4%" in texts
    assert t("fig2_paper_mark") in texts
    plt.close(fig)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_papers_mark_is_drawn_against_the_share_of_memory_in_use(lang):
    """The paper's shares are of the memory in use: its 96.3% stands beside the paged run's in-use
    bar (10% token states of 11% in use = 90.9%), not beside the pool bar (10%, 89% free). The
    pool panel has no mark; the in-use panel has no free part; both are labelled as such."""
    fig = plot_memory_breakdown(ROWS, lang=lang)
    pool, used = fig.axes
    assert not [line for line in pool.lines if line.get_linestyle() == "--"]
    used_bars = segments(fig, 1)
    assert t("fig2_free", lang) not in used_bars
    paged_in_use = {label: round(bars[0][1], 6) for label, bars in used_bars.items()}
    assert paged_in_use[t("token_states", lang)] == round(100 * 0.10 / 0.11, 6)
    assert round(sum(paged_in_use.values()), 6) == 100.0
    assert [round(w, 6) for _, w in segments(fig, 0)[t("token_states", lang)]] == [10.0, 5.0]
    mark = next(line for line in used.lines if line.get_linestyle() == "--" and round(line.get_xdata()[0], 6) == 96.3)
    assert min(mark.get_ydata()) < 0 < max(mark.get_ydata())  # on the paged row (the first, y = 0)
    texts = figure_texts(fig)
    assert t("fig2_of_pool", lang) in " ".join(texts) and t("fig2_of_in_use", lang) in texts
    assert t("fig2_axis", lang) in texts and t("fig2_axis_in_use", lang) in texts
    assert "90.9%" in texts and "10.0%" in texts
    assert t("fig2_free", lang) in texts
    if lang == "zh":
        assert "空闲（未使用）" in texts and "占已用显存的比例（%）" in texts
    else:
        assert "free (not in use)" in texts and "share of the memory in use (%)" in texts
    plt.close(fig)


def test_the_figure_is_compact_with_horizontal_labels():
    """Two systems make a short figure (it was ~1,000 px tall with rotated labels)."""
    fig = plot_memory_breakdown(ROWS)
    width, height = fig.get_size_inches() * fig.dpi
    assert height < 450 and width > height
    assert all(label.get_rotation() == 0 for ax in fig.axes for label in ax.get_yticklabels() + ax.get_xticklabels())
    plt.close(fig)


def test_chinese_figure_has_no_english_ui_text():
    from app_pages.compare import system_label

    rows = [dict(r, workload=t("fig2_workload_engine", "zh"), system=system_label(r["system"], "zh")) for r in ROWS]
    fig = plot_memory_breakdown(rows, lang="zh")
    texts = figure_texts(fig)
    assert t("fig2_axis", "zh") in texts and t("fig2_free", "zh") in texts
    assert untranslated(" | ".join(texts)) == []
    plt.close(fig)
    fig = plot_memory_breakdown(ROWS, lang="en")  # the check itself finds English
    assert "internal fragmentation" in untranslated(" | ".join(figure_texts(fig)))
    plt.close(fig)


def test_memory_chart_legends_are_never_cut():
    import pandas as pd

    from visualize.memory import memory_chart

    frame = pd.DataFrame([dict(step=0, token_states=3, reserved=0, internal_fragmentation=1, external_fragmentation=0, free=4)])
    legend = memory_chart(frame, legend_columns=2).to_dict()["encoding"]["color"]["legend"]
    assert legend["labelLimit"] == 0 and legend["columns"] == 2  # "internal fragmentation" was cut to 160 px


def _sweep_rows():
    """A two-system sweep by hand: vLLM and Orca (Max) at two rates (s/token)."""
    return [dict(workload="sharegpt", system=s, request_rate=r, normalized_latency_s=lat)
            for s, pts in (("Orca (Max)", ((0.5, 0.1), (1.0, 0.5))), ("vLLM", ((0.5, 0.05), (1.0, 0.06))))
            for r, lat in pts]


def test_latency_rate_spec_draws_the_papers_bands_at_its_ratios_of_the_vllm_rate():
    """vLLM sustains 2.0 req/s here: the paper's 2.7-8x puts Orca (Max) between 2/8 = 0.25 and
    2/2.7 = 0.74 req/s, 1.7-2.7x puts Orca (Oracle) between 0.74 and 1.18, "up to 22x" puts
    FasterTransformer's rule at 2/22 = 0.091; each band in its system's colour, labelled "paper"."""
    from engine.experiments.figures import paper_rate_marks
    from visualize.paper import SYSTEM_COLORS, latency_rate_spec, paper_system_label

    marks = paper_rate_marks("sharegpt", 2.0)
    assert {m["system"]: (m["low_rate"], m["high_rate"]) for m in marks} == {
        "Orca (Oracle)": (pytest.approx(2 / 2.7), pytest.approx(2 / 1.7)), "Orca (Max)": (0.25, pytest.approx(2 / 2.7)),
        "FasterTransformer": (pytest.approx(2 / 22), None)}
    assert paper_rate_marks("alpaca", 2.0) == []  # the paper's text gives no Alpaca ratio
    for lang in ("en", "zh"):
        spec = latency_rate_spec(_sweep_rows(), lang, marks)
        lines, *paper = spec["layer"]
        assert [v["normalized_latency_s"] for v in spec["data"]["values"]] == [0.1, 0.5, 0.05, 0.06]
        bands = next(l for l in paper if l["mark"]["type"] == "rect")
        rule = next(l for l in paper if l["mark"]["type"] == "rule")
        assert {v["system"]: (v["low_rate"], v["high_rate"]) for v in bands["data"]["values"]} == {
            paper_system_label("Orca (Oracle)", lang): (pytest.approx(2 / 2.7), pytest.approx(2 / 1.7)),
            paper_system_label("Orca (Max)", lang): (0.25, pytest.approx(2 / 2.7))}
        assert [v["low_rate"] for v in rule["data"]["values"]] == [pytest.approx(2 / 22)]
        assert bands["encoding"]["x2"] == {"field": "high_rate"} and bands["mark"]["opacity"] < 0.5
        texts = [v["label"] for l in paper if l["mark"]["type"] == "text" for v in l["data"]["values"]]
        assert texts == [t("paper_mark", lang)] * 3
        # One colour scale over lines and marks: a band is drawn in its system's colour.
        scale = lines["encoding"]["color"]["scale"]
        assert all(l["encoding"]["color"]["scale"] == scale for l in paper)
        colour = dict(zip(scale["domain"], scale["range"]))
        assert colour[paper_system_label("Orca (Max)", lang)] == SYSTEM_COLORS["Orca (Max)"]
        tips = [v["paper"] for v in bands["data"]["values"] + rule["data"]["values"]]
        assert tips == ["1.7–2.7×", "2.7–8×", t("paper_ratio_up_to", lang, high="22")]
    zh = latency_rate_spec(_sweep_rows(), "zh", marks)  # what a reader sees: titles, labels, tooltips' titles
    shown = [zh["title"], *(v["system"] for v in zh["data"]["values"])]
    for layer in zh["layer"]:
        enc = layer["encoding"]
        shown += [enc[c]["title"] for c in ("x", "y", "color") if c in enc and "title" in enc[c]]
        shown += [tip["title"] for tip in enc.get("tooltip", [])]
        shown += [v[k] for v in layer.get("data", {}).get("values", []) for k in ("system", "label", "paper")]
    assert untranslated("\n".join(shown)) == [] and "论文" in texts
    assert len(latency_rate_spec(_sweep_rows(), "en")["layer"]) == 1  # no marks asked: the lines alone


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_share_metrics_name_both_measures_and_the_part_not_in_use(lang):
    frag = ROWS[0]["fragmentation"]  # 10% token states, 1% internal fragmentation, 89% free
    assert share_metrics(frag, lang) == [(t("token_share_pool", lang), "10.0%"), (t("token_share_in_use", lang), "90.9%"),
                                         (t("not_in_use", lang), "89.0%")]
    labels = " ".join(label for label, _ in share_metrics(frag, lang))
    assert ("未使用" in labels and untranslated(labels) == []) if lang == "zh" else "not in use" in labels


def _compare_page():
    import os
    import sys

    import streamlit as st

    sys.path.insert(0, os.getcwd())
    from app_pages import compare
    from app_pages.state import Settings

    st.session_state.setdefault("lang", "en")
    st.session_state["settings"] = Settings()
    compare.page()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_simulator_view_shows_the_scheduler_rule_and_both_shares(lang):
    """Paged vs contiguous → simulator: the run's scheduler rule is named, and each side shows token
    states as a share of the pool and of the memory in use, and the part not in use, as the
    simulator computes them (the paper's scheduler first); choosing another rule reruns with it."""
    from streamlit.testing.v1 import AppTest

    from engine.experiments.paper_data import SCHEDULER_RULES
    from engine.sim.simulator import simulate

    at = AppTest.from_function(_compare_page, default_timeout=180)
    at.session_state["lang"] = lang
    at.run()
    at.radio(key=f"compare_source__{lang}").set_value("sim").run()
    assert not at.exception, [e.value for e in at.exception]

    def shown():
        captions = " ".join(c.value for c in at.main.caption)
        metrics = [(m.label, m.value) for m in at.main.metric][:3]  # the paged side's first row
        return captions, metrics

    for rule in ("paper", "prefills", "decodes"):
        if rule != "paper":
            at.selectbox(key=f"sim_rule__{lang}").set_value(rule).run()
        captions, metrics = shown()
        assert t("sched_rule_run", lang, rule=t(f"sched_rule_{rule}", lang)) in captions
        res = simulate(workload="sharegpt", num_requests=500, kv_slots=15_700, block_size=16, seed=0, **SCHEDULER_RULES[rule])
        assert metrics == share_metrics(res.fragmentation, lang)
    assert metrics[0][1] == "75.4%"  # decodes first on whole prompts: the run that idles with a full queue


def test_latency_chart_ticks_are_regular_and_few():
    """Log ticks at 1, 2 and 5 times the powers of ten (not 0.01, 0.03, 0.2, 1, 3), a handful of rate labels."""
    from visualize.paper import latency_rate_spec, log_ticks

    assert log_ticks(0.013, 3.2) == [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]
    assert log_ticks(0.04, 0.06) == [0.02, 0.05, 0.1]
    assert log_ticks(0.001, 50) == [0.001, 0.01, 0.1, 1.0, 10.0, 100.0]  # a wide range: decades only
    spec = latency_rate_spec(_sweep_rows(), "en")
    encoding = spec["layer"][0]["encoding"]
    assert encoding["y"]["axis"]["values"] == [0.05, 0.1, 0.2, 0.5]  # the rows span 0.05..0.5 s/token
    assert encoding["x"]["axis"]["tickCount"] <= 8
