"""visualize/paper.py: the Figure 2 bars keep free memory apart, draw the paper's marks, speak Chinese."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.colors import to_hex

from engine.accounting import CATEGORIES
from visualize.colors import CATEGORY_COLORS
from visualize.i18n import t, untranslated
from visualize.paper import figure_texts, plot_memory_breakdown

# A paged run on a half-empty pool: 10% token states, 1% internal fragmentation, the rest free.
ROWS = [
    dict(workload="engine", system="paged", token_state_fraction=0.10, paper_token_state_fraction=0.963,
         fragmentation=dict(token_states=0.10, reserved=0.0, internal_fragmentation=0.01, external_fragmentation=0.0, free=0.89)),
    dict(workload="engine", system="contiguous (max)", token_state_fraction=0.05, paper_token_state_fraction=0.204,
         fragmentation=dict(token_states=0.05, reserved=0.3, internal_fragmentation=0.4, external_fragmentation=0.05, free=0.2)),
]


def segments(fig) -> dict[str, list[tuple[str, float]]]:
    """Per legend label: (colour, height in %) of its bars."""
    ax = fig.axes[0]
    out = {}
    for container in ax.containers:
        out[container.get_label()] = [(to_hex(p.get_facecolor()), p.get_height()) for p in container.patches]
    return out


def test_free_memory_is_its_own_grey_segment_not_fragmentation():
    fig = plot_memory_breakdown(ROWS)
    bars = segments(fig)
    assert list(bars) == [t(c) for c in CATEGORIES]
    free = bars[t("free")]
    assert [round(h, 6) for _, h in free] == [89.0, 20.0]
    assert {c for c, _ in free} == {CATEGORY_COLORS["free"]}
    external = [h for _, h in bars[t("external_fragmentation")]]
    assert [round(h, 6) for h in external] == [0.0, 5.0]  # paged external fragmentation stays 0
    plt.close(fig)


def test_the_papers_marks_are_drawn_with_their_values():
    fig = plot_memory_breakdown(ROWS)
    ax = fig.axes[0]
    dashed = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert sorted(round(line.get_ydata()[0], 6) for line in dashed) == [20.4, 96.3]
    texts = figure_texts(fig)
    assert "paper 96.3%" in texts and "paper 20.4%" in texts
    assert t("fig2_paper_mark") in texts
    plt.close(fig)


def test_chinese_figure_has_no_english_ui_text():
    from app_pages.compare import system_label

    rows = [dict(r, workload=t("fig2_workload_engine", "zh"), system=system_label(r["system"], "zh")) for r in ROWS]
    fig = plot_memory_breakdown(rows, lang="zh")
    texts = figure_texts(fig)
    assert t("fig2_axis", "zh") in texts and t("free", "zh") in texts
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
