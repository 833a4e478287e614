"""The PagedAttention paper's figures, redrawn from the engine's plain results.

Figures 12, 13 and 18b (``save_paper_figure``, ``python -m visualize reproduce-paper --figure N --out``)
come from ``engine.experiments.figures`` results, the paper's numbers marked beside ours. Figure 2
(``plot_memory_breakdown``) from ``reproduce_paper`` rows (or the app's runs):

One stacked bar per system, twice: each segment a share of the whole KV pool (engine/core/accounting.py:
token states, reserved, internal fragmentation, external fragmentation, and free, grey, "not in
use"), and beside it a share of the memory in use (the pool less its free part), which is what the
paper's percentages are. The paper's own token-state share is drawn on the in-use bar as a black
dashed mark with its value wherever a row carries ``paper_token_state_fraction``.

The paper's legend says "External frag. & Others": "others" is memory that none of its categories
name; here every slot has a category, so that part is our external fragmentation (and free, when
the pool is not full).
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from engine.core.accounting import CATEGORIES, in_use_shares
from engine.experiments.figures import paper_ratio_text
from visualize.colors import CATEGORY_COLORS
from visualize.i18n import t
from visualize.style import as_svg, finish, use_cjk_font

# The app's system labels -> the paper's Figure 2 systems (Kwon et al., SOSP 2023).
PAPER_SYSTEM_OF = {"paged": "vLLM", "contiguous (max)": "Orca (Max)", "contiguous (pow2)": "Orca (Pow2)",
                   "contiguous (oracle)": "Orca (Oracle)"}


def plot_memory_breakdown(rows: list[dict], out: str | None = None, lang: str = "en"):
    """Each (workload, system) row's memory shares, two ways side by side, one row of panels per workload.

    Left: each category's share of the whole KV pool, free memory included (grey, "not in use").
    Right: each category's share of the memory *in use*, the pool less its free part
    (``engine.core.accounting.in_use_shares``): the paper's measure, so the paper's token-state share is
    drawn there, as a black dashed mark with its value. Horizontal bars, one per system.

    Args:
        rows: ``engine.experiments.memory.reproduce_paper`` rows: ``workload``, ``system`` (its bar label),
            ``fragmentation`` (share per category of engine.core.accounting.CATEGORIES, 0..1),
            ``token_state_fraction`` and optionally ``paper_token_state_fraction`` (0..1 or None).
        out: save the figure to this path (PNG) when given.
        lang: "en" or "zh" for every text of the figure.

    Returns:
        The matplotlib Figure; its axes come in pairs (pool, in use) per workload.
    """
    use_cjk_font()
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    most = max(sum(1 for r in rows if r["workload"] == w) for w in workloads)
    panel_height = 0.5 * most + 0.9
    fig, axes = plt.subplots(len(workloads), 2, figsize=(8.4, panel_height * len(workloads) + 0.9), squeeze=False)
    for (pool_ax, used_ax), workload in zip(axes, workloads):
        wrows = [r for r in rows if r["workload"] == workload]
        _panel(pool_ax, wrows, [r["fragmentation"] for r in wrows], CATEGORIES, lang, paper_marks=False)
        _panel(used_ax, wrows, [in_use_shares(r["fragmentation"]) for r in wrows], CATEGORIES[:-1], lang, paper_marks=True)
        pool_ax.set_title(t("fig2_title", lang, workload=workload) + "\n" + t("fig2_of_pool", lang), fontsize=9)
        used_ax.set_title(t("fig2_of_in_use", lang), fontsize=9)
        used_ax.set_yticklabels([])
    axes[-1][0].set_xlabel(t("fig2_axis", lang))
    axes[-1][1].set_xlabel(t("fig2_axis_in_use", lang))
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(plt.Line2D([], [], color="black", linestyle="--"))
    labels.append(t("fig2_paper_mark", lang))
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.75 / fig.get_figheight(), 1, 1))
    if out:
        fig.savefig(out, dpi=150)
    return fig


def _panel(ax, rows: list[dict], shares: list[dict], categories, lang: str, paper_marks: bool) -> None:
    """Horizontal stacked bars (first row on top) of ``shares`` (category -> 0..1, one dict per row)."""
    names = [r["system"] for r in rows]
    y = list(range(len(rows)))
    left = [0.0] * len(rows)
    for key in categories:
        width = [s.get(key, 0.0) * 100 for s in shares]
        label = t("fig2_free", lang) if key == "free" else t(key, lang)
        ax.barh(y, width, left=left, color=CATEGORY_COLORS[key], label=label, edgecolor="white", height=0.6)
        left = [a + b for a, b in zip(left, width)]
    for i, (r, s) in enumerate(zip(rows, shares)):
        token = s.get("token_states", 0.0)
        ax.text(max(token * 50, 1), i, f"{token:.1%}", ha="center" if token > 0.1 else "left", va="center", fontsize=8)
        paper = r.get("paper_token_state_fraction")
        if paper_marks and paper is not None:
            ax.plot([paper * 100, paper * 100], [i - 0.4, i + 0.4], color="black", linestyle="--", linewidth=1.2)
            ax.text(paper * 100, i - 0.42, t("fig2_paper_value", lang, value=f"{paper:.1%}"), ha="right", va="bottom", fontsize=7)
    ax.set_yticks(y, names, fontsize=8)
    ax.set_ylim(len(rows) - 0.4, -0.75)  # first row on top, room above it for a paper label
    ax.set_xlim(0, 100)
    ax.set_xticks(range(0, 101, 20))


def share_metrics(fragmentation: dict[str, float], lang: str = "en") -> list[tuple[str, str]]:
    """The memory metrics of a run, as (label, value) pairs in the reader's language: token states'
    share of the pool, their share of the memory in use (the paper's measure), and the part of the
    pool not in use (free). ``fragmentation``: share per category of engine.core.accounting.CATEGORIES."""
    return [(t("token_share_pool", lang), f"{fragmentation['token_states']:.1%}"),
            (t("token_share_in_use", lang), f"{in_use_shares(fragmentation)['token_states']:.1%}"),
            (t("not_in_use", lang), f"{fragmentation['free']:.1%}")]


def figure_texts(fig) -> list[str]:
    """Every text a reader sees in a matplotlib figure (titles, axis labels, ticks, legends, notes)."""
    return [a.get_text() for a in fig.findobj(plt.Text) if a.get_text().strip()]


SYSTEM_COLORS = {"Orca (Max)": "#d62728", "Orca (Pow2)": "#ff7f0e", "Orca (Oracle)": "#9467bd", "vLLM": "#1f77b4",
                 "FasterTransformer": "#7f7f7f"}


def plot_latency_vs_rate(result: dict, out: str | None = None):
    """Figure 12: normalized latency (s/token) against request rate, one panel per workload, a
    dotted line at each system's sustainable rate; the paper's ratio range in the title."""
    rows = result["rows"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = _panels(len(workloads), 4.8)
    for ax, workload in zip(axes[0], workloads):
        for system in dict.fromkeys(r["system"] for r in rows):
            color = SYSTEM_COLORS[system]
            mine = [r for r in rows if r["workload"] == workload and r["system"] == system]
            ax.plot([r["request_rate"] for r in mine], [r["normalized_latency_s"] for r in mine], "o-", color=color,
                    label=system, markersize=4)
            s = next(x for x in result["sustainable"] if x["workload"] == workload and x["system"] == system)
            if s["reached"]:
                ax.axvline(s["rate"], color=color, linestyle=":", linewidth=1)
        ratios = [r for r in result["ratios"] if r["workload"] == workload and r["paper"]]
        paper = "\n".join(f"vs {r['baseline']}: {r['ratio']:.1f}x (paper {paper_ratio_text(r['paper'])})" for r in ratios)
        ax.set_title(f"{workload}" + (f"\n{paper}" if paper else ""), fontsize=9)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("normalized latency (s/token)")
        ax.set_yscale("log")
    return finish(fig, axes, out)


def plot_batched_requests(rows: list[dict], out: str | None = None):
    """Figure 13: mean batched requests per system, ours beside the paper's, one panel per workload."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = _panels(len(workloads))
    for ax, workload in zip(axes[0], workloads):
        mine = [r for r in rows if r["workload"] == workload]
        x = range(len(mine))
        ax.bar([i - 0.2 for i in x], [r["mean_batched_requests"] for r in mine], 0.4, label="simulated",
               color=[SYSTEM_COLORS[r["system"]] for r in mine])
        ax.bar([i + 0.2 for i in x], [r["paper_mean_batched_requests"] for r in mine], 0.4, label="paper",
               color="white", edgecolor="black", hatch="//")
        ax.set_xticks(list(x), [r["system"] for r in mine], rotation=20, fontsize=8)
        ax.set_title(f"{workload} at {mine[0]['request_rate']:g} req/s")
        ax.set_ylabel("mean batched requests")
    return finish(fig, axes, out)


def plot_block_size(result: dict, out: str | None = None):
    """Figure 18b: vLLM's normalized latency against block size; the paper's best range shaded."""
    rows = result["rows"]
    fig, axes = _panels(len(result["rates"]))
    for ax, (workload, rate) in zip(axes[0], result["rates"].items()):
        mine = [r for r in rows if r["workload"] == workload]
        lo, hi = result["paper_best"][workload]
        ax.axvspan(lo, hi, color="#cccccc", alpha=0.5, label="paper: best")
        ax.plot([r["block_size"] for r in mine], [r["normalized_latency_s"] for r in mine], "o-", color=SYSTEM_COLORS["vLLM"],
                label="simulated")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{workload} at {rate:g} req/s")
        ax.set_xlabel("block size (tokens)")
        ax.set_ylabel("normalized latency (s/token)")
    return finish(fig, axes, out)


def _panels(n: int, width: float = 4.4):
    return plt.subplots(1, n, figsize=(width * n, 3.8), squeeze=False)


def plot_sharing(rows: list[dict], out: str | None = None):
    """Figure 15: memory saved by sharing per workload, parallel sampling and beam search, k = 2/4/6;
    simulated bars with the paper's numbers as black marks where it gives one."""
    fig, axes = _panels(2)
    for ax, workload in zip(axes[0], ("alpaca", "sharegpt")):
        mine = [r for r in rows if r["workload"] == workload]
        labels = [f"{'n' if r['mode'] == 'parallel' else 'beam'} = {r['k']}" for r in mine]
        x = range(len(mine))
        ax.bar(x, [100 * r["memory_saved_by_sharing"] for r in mine], color=["#1f77b4" if r["mode"] == "parallel" else "#ff7f0e" for r in mine])
        marks = [(i, 100 * r["paper"]) for i, r in enumerate(mine) if r["paper"] is not None]
        ax.plot([i for i, _ in marks], [v for _, v in marks], "k_", markersize=18, markeredgewidth=2.5, label="paper")
        ax.set_xticks(list(x), labels, rotation=30)
        ax.set_title(workload)
        ax.set_ylabel("memory saved by sharing (%)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    if out:
        fig.savefig(out, dpi=150)
    return fig


def save_paper_figure(figure: str, result, out: str):
    """Draw one ``python -m visualize reproduce-paper`` result ("memory", "2", "12", "13", "15", "18b", "19") to ``out``."""
    from visualize.swap_figure import plot_swap_vs_recompute

    draw = {"memory": plot_memory_breakdown, "2": plot_memory_breakdown, "12": plot_latency_vs_rate,
            "13": plot_batched_requests, "15": plot_sharing, "18b": plot_block_size, "19": plot_swap_vs_recompute}
    fig = draw[figure](result, out)
    plt.close(fig)
    return out


def paper_system_label(system: str, lang: str = "en") -> str:
    """A Figure 12 system ("vLLM", "Orca (Max)", ..., "FasterTransformer") in the reader's language."""
    if system == "vLLM":
        return t("psys_vllm", lang)
    if system.startswith("Orca ("):
        return t("psys_orca", lang, reservation=system[len("Orca ("):-1])
    return t("psys_static", lang)


def latency_rate_spec(rows: list[dict], lang: str = "en", paper_marks: list[dict] | None = None) -> dict:
    """Figure 12 in the app: a Vega-Lite spec of normalized latency (s/token, log scale) against
    request rate (req/s), one line per system; ``rows`` are ``engine.experiments.figures.latency_sweep``'s
    for one workload. The lines' data are the top-level ``data.values`` rows (rate, latency, system
    label). ``paper_marks`` (``engine.experiments.figures.paper_rate_marks``): per baseline, a band in
    its colour from ``low_rate`` to ``high_rate`` (a dashed rule at ``low_rate`` where the paper gives
    only "up to"), labelled "paper", each in its own layer's ``data.values``. No height:
    Streamlit's ``st.vega_lite_chart(..., height=)`` sets it (a height in the spec is squeezed)."""
    workload = rows[0]["workload"] if rows else ""
    values = [{"request_rate": r["request_rate"], "normalized_latency_s": r["normalized_latency_s"],
               "system": paper_system_label(r["system"], lang)}
              for r in rows if r["normalized_latency_s"] == r["normalized_latency_s"]]  # NaN: nothing completed
    systems = list(dict.fromkeys(r["system"] for r in rows))
    color = {"field": "system", "type": "nominal", "title": t("system_axis", lang),
             "scale": {"domain": [paper_system_label(s, lang) for s in systems], "range": [SYSTEM_COLORS[s] for s in systems]},
             "legend": {"labelLimit": 0}}
    rate = {"type": "quantitative", "title": t("rate_axis", lang), "axis": {"tickCount": 6}}
    latencies = [v["normalized_latency_s"] for v in values]
    lines = {
        "mark": {"type": "line", "point": True, "tooltip": True},
        "encoding": {
            "x": {"field": "request_rate", **rate},
            "y": {"field": "normalized_latency_s", "type": "quantitative", "title": t("norm_latency_axis", lang),
                  "scale": {"type": "log"}, "axis": {"values": log_ticks(min(latencies), max(latencies)) if latencies else []}},
            "color": color,
        },
    }
    return as_svg({"title": t("latency_rate_title", lang, workload=workload), "data": {"values": values},
                   "layer": [lines, *_paper_layers(paper_marks or [], lang, rate, color)]})


def log_ticks(low: float, high: float) -> list[float]:
    """Tick values for a log axis over [low, high] (> 0): 1, 2 and 5 times each power of ten, from the
    one at or below ``low`` to the one at or above ``high``; only the powers of ten where that
    gives more than ten ticks."""
    import math

    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    steps = (1, 2, 5) if last - first <= 3 else (1,)
    ticks = [round(m * 10.0 ** e, 12) for e in range(first, last + 1) for m in steps]
    below = max([x for x in ticks if x <= low], default=ticks[0])
    above = min([x for x in ticks if x >= high], default=ticks[-1])
    return [x for x in ticks if below <= x <= above]


def _paper_layers(marks: list[dict], lang: str, rate: dict, color: dict) -> list[dict]:
    """The paper's ranges as Vega-Lite layers: bands (rect), rules ("up to"), and their "paper" labels."""
    rows = [{"system": paper_system_label(m["system"], lang), "low_rate": m["low_rate"], "high_rate": m["high_rate"],
             "label": t("paper_mark", lang), "paper": paper_ratio_label(m["paper"], lang), "row": i}
            for i, m in enumerate(marks)]
    bands, rules = [r for r in rows if r["high_rate"] is not None], [r for r in rows if r["high_rate"] is None]
    tooltip = [{"field": "system", "title": t("system_axis", lang)}, {"field": "paper", "title": t("paper_ratio_col", lang)}]
    layers = []
    if bands:
        layers.append({"data": {"values": bands}, "mark": {"type": "rect", "opacity": 0.15},
                       "encoding": {"x": {"field": "low_rate", **rate}, "x2": {"field": "high_rate"}, "color": color,
                                    "tooltip": tooltip}})
    if rules:
        layers.append({"data": {"values": rules}, "mark": {"type": "rule", "strokeDash": [5, 3], "strokeWidth": 2},
                       "encoding": {"x": {"field": "low_rate", **rate}, "color": color, "tooltip": tooltip}})
    for r in rows:  # one label per mark, stacked under the top edge
        layers.append({"data": {"values": [r]}, "mark": {"type": "text", "align": "left", "baseline": "top", "dx": 3, "dy": 14 * r["row"]},
                       "encoding": {"x": {"field": "low_rate", **rate}, "y": {"value": 4}, "text": {"field": "label"}, "color": color}})
    return layers


def paper_ratio_label(paper: tuple | None, lang: str = "en", decimals: int | None = None) -> str:
    """The paper's ratio (low, high) in the reader's language: "1.7–2.7×", "up to 22×", or "–";
    with ``decimals``, every number with that many ("2.7–8.0×", for a table's column)."""
    if not paper:
        return "–"
    fmt = "g" if decimals is None else f".{decimals}f"
    if paper[0] is None:
        return t("paper_ratio_up_to", lang, high=f"{paper[1]:{fmt}}")
    return f"{paper[0]:{fmt}}–{paper[1]:{fmt}}×"
