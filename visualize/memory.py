"""KV memory over steps, stacked in the PagedAttention paper's Figure 2 categories.

``memory_frame`` turns a list of :class:`StepReport` (or the simulator's series) into a tidy table;
``memory_figure`` draws it with matplotlib (slides), ``memory_chart`` with Altair (hover a step).
"""

from __future__ import annotations

import altair as alt
import matplotlib.pyplot as plt
import pandas as pd

from engine.core.accounting import CATEGORIES
from engine.report import StepReport
from visualize.colors import CATEGORY_COLORS
from visualize.i18n import t
from visualize.style import as_svg, use_cjk_font

MIB = 1 << 20


def memory_frame(reports: list[StepReport], unit: str = "tokens") -> pd.DataFrame:
    """One row per step: ``step`` and one column per category, in token slots or MiB (``unit="MiB"``)."""
    if unit not in ("tokens", "MiB"):
        raise ValueError(f"unit must be 'tokens' or 'MiB', got {unit!r}")
    rows = []
    for r in reports:
        scale = r.memory.bytes_per_slot / MIB if unit == "MiB" else 1
        rows.append({"step": r.step, **{c: getattr(r.memory, c) * scale for c in CATEGORIES}})
    return pd.DataFrame(rows, columns=["step", *CATEGORIES])


def simulation_memory_frame(result) -> pd.DataFrame:
    """The simulator's run-length encoded series (``SimulationResult``) as one row per series entry,
    at its first step, in token slots (mean over the stretch it covers)."""
    data = {"step": result.series_step}
    data.update({c: result.series_memory[c] for c in CATEGORIES})
    return pd.DataFrame(data, columns=["step", *CATEGORIES])


def _close_last_step(frame: pd.DataFrame) -> pd.DataFrame:
    """Repeat the last row one step later: drawn step-after, each step then spans [step, step + 1),
    so the latest step (and a run of a single step) is visible instead of having zero width."""
    if not len(frame):
        return frame
    last = frame.tail(1).assign(step=frame["step"].iloc[-1] + 1)
    return pd.concat([frame, last], ignore_index=True)


def memory_figure(frame: pd.DataFrame, unit: str = "tokens", lang: str = "en", title: str | None = None, ax=None):
    """Stacked areas of the categories over steps (matplotlib)."""
    use_cjk_font()
    if ax is None:
        fig, ax = plt.subplots(figsize=(7, 3))
    else:
        fig = ax.figure
    labels = [t(c, lang) for c in CATEGORIES]
    frame = _close_last_step(frame)
    if len(frame):
        ax.stackplot(frame["step"], *[frame[c] for c in CATEGORIES], labels=labels,
                     colors=[CATEGORY_COLORS[c] for c in CATEGORIES], step="post")
    ax.set_xlabel(t("step_axis", lang))
    ax.set_ylabel(t("tokens", lang) if unit == "tokens" else "MiB")
    ax.set_title(title or t("memory", lang))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    ax.margins(x=0)
    fig.tight_layout()
    return fig


def memory_chart(frame: pd.DataFrame, unit: str = "tokens", lang: str = "en", height: int = 220,
                 legend_columns: int = 3) -> alt.Chart:
    """Interactive stacked areas (Altair): hover to read a step's slots per category.

    The legend's labels are never cut (``labelLimit=0``); narrow charts ask for fewer ``legend_columns``.
    """
    # Step s is drawn over [s - 0.5, s + 0.5), centred on its tick; the axis ends with the last step.
    closed = _close_last_step(frame)
    closed = closed.assign(x=closed["step"] - 0.5, step=closed["step"].clip(upper=frame["step"].max() if len(frame) else 0))
    long = closed.melt(["step", "x"], value_vars=list(CATEGORIES), var_name="category", value_name="amount")
    domain = [float(frame["step"].min()) - 0.5, float(frame["step"].max()) + 0.5] if len(frame) else [0, 1]
    long["label"] = [t(c, lang) for c in long["category"]]
    long["order"] = [CATEGORIES.index(c) for c in long["category"]]
    ylabel = t("tokens", lang) if unit == "tokens" else "MiB"
    color = alt.Color("label:N", title=None,
                      scale=alt.Scale(domain=[t(c, lang) for c in CATEGORIES], range=[CATEGORY_COLORS[c] for c in CATEGORIES]),
                      legend=alt.Legend(orient="bottom", columns=legend_columns, labelLimit=0))
    return as_svg(alt.Chart(long).mark_area(interpolate="step-after").encode(
        x=alt.X("x:Q", title=t("step_axis", lang), axis=alt.Axis(format="d", tickMinStep=1),  # whole steps
                scale=alt.Scale(domain=domain, nice=False, zero=False)),
        y=alt.Y("amount:Q", stack="zero", title=ylabel),
        color=color,
        order=alt.Order("order:Q"),
        tooltip=[alt.Tooltip("step:Q", title=t("step_axis", lang)), alt.Tooltip("label:N", title=""),
                 alt.Tooltip("amount:Q", title=ylabel, format=".1f")],
    ).properties(height=height))


def series_spec(series: dict[str, tuple], ylabel: str, lang: str = "en") -> dict:
    """:func:`series_figure` as a Vega-Lite spec for the app (hover a step): a step line of
    (steps, values) per label, in the order given, the legend below and never cut. A run that ends
    early stops there (it is not drawn flat to the longest run's end). No height: Streamlit's
    ``st.vega_lite_chart(..., height=)`` sets it (a height in the spec is squeezed, and the y title
    was then cut)."""
    values = [{"step": int(s), "value": float(v), "label": label} for label, (steps, vs) in series.items() for s, v in zip(steps, vs)]
    return as_svg({
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "data": {"values": values},
        "mark": {"type": "line", "interpolate": "step-after", "strokeWidth": 2, "tooltip": True},
        "encoding": {
            "x": {"field": "step", "type": "quantitative", "title": t("step_axis", lang), "axis": {"format": "d", "tickMinStep": 1}},
            "y": {"field": "value", "type": "quantitative", "title": ylabel},
            "color": {"field": "label", "type": "nominal", "title": None, "sort": list(series), "scale": {"scheme": "category10"},
                      "legend": {"orient": "bottom", "labelLimit": 0}},
        },
    })


def series_figure(series: dict[str, tuple], ylabel: str, lang: str = "en", title: str | None = None, ax=None):
    """Lines of (steps, values) per label, e.g. concurrent requests of paged vs contiguous."""
    use_cjk_font()
    if ax is None:
        fig, ax = plt.subplots(figsize=(6, 2.6))
    else:
        fig = ax.figure
    for label, (steps, values) in series.items():
        ax.step(steps, values, where="post", label=label)
    ax.set_xlabel(t("step_axis", lang))
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
