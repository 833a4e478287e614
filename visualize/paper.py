"""The PagedAttention paper's Figure 2, redrawn from ``reproduce_paper`` rows (or the app's runs).

One stacked bar per system, each segment a share of the KV pool (engine/accounting.py): token
states, reserved, internal fragmentation, external fragmentation, and free (grey; the paper's bars
are taken with a full pool, where nothing is free). The paper's own token-state share is drawn as a
black dashed mark with its value wherever a row carries ``paper_token_state_fraction``.

The paper's legend says "External frag. & Others": "others" is memory that none of its categories
name; here every slot has a category, so that part is our external fragmentation (and free, when
the pool is not full).
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from engine.accounting import CATEGORIES
from visualize.colors import CATEGORY_COLORS
from visualize.i18n import t
from visualize.style import use_cjk_font

# The app's system labels -> the paper's Figure 2 systems (Kwon et al., SOSP 2023).
PAPER_SYSTEM_OF = {"paged": "vLLM", "contiguous (max)": "Orca (Max)", "contiguous (pow2)": "Orca (Pow2)",
                   "contiguous (oracle)": "Orca (Oracle)"}


def plot_memory_breakdown(rows: list[dict], out: str | None = None, lang: str = "en"):
    """Stacked bars of each (workload, system) row's memory shares, one panel per workload.

    Args:
        rows: ``engine.simulator.reproduce_paper`` rows: ``workload``, ``system`` (its bar label),
            ``fragmentation`` (share per category of engine.accounting.CATEGORIES, 0..1),
            ``token_state_fraction`` and optionally ``paper_token_state_fraction`` (0..1 or None).
        out: save the figure to this path (PNG) when given.
        lang: "en" or "zh" for every text of the figure.

    Returns:
        The matplotlib Figure.
    """
    use_cjk_font()
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.6 * len(workloads), 4.4), sharey=True, squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        wrows = [r for r in rows if r["workload"] == workload]
        _panel(ax, wrows, lang)
        ax.set_title(t("fig2_title", lang, workload=workload))
    axes[0][0].set_ylabel(t("fig2_axis", lang))
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(plt.Line2D([], [], color="black", linestyle="--"))
    labels.append(t("fig2_paper_mark", lang))
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.14, 1, 1))
    if out:
        fig.savefig(out, dpi=150)
    return fig


def _panel(ax, rows: list[dict], lang: str) -> None:
    names = [r["system"] for r in rows]
    bottom = [0.0] * len(rows)
    for key in CATEGORIES:
        share = [r["fragmentation"].get(key, 0.0) * 100 for r in rows]
        ax.bar(names, share, bottom=bottom, color=CATEGORY_COLORS[key], label=t(key, lang), edgecolor="white", width=0.6)
        bottom = [b + s for b, s in zip(bottom, share)]
    for i, r in enumerate(rows):
        ax.text(i, r["fragmentation"].get("token_states", 0.0) * 50, f"{r['token_state_fraction']:.1%}", ha="center", fontsize=8)
        paper = r.get("paper_token_state_fraction")
        if paper is not None:
            ax.plot([i - 0.4, i + 0.4], [paper * 100, paper * 100], color="black", linestyle="--", linewidth=1.2)
            ax.text(i, paper * 100 + 1, t("fig2_paper_value", lang, value=f"{paper:.1%}"), ha="center", va="bottom", fontsize=7)
    ax.set_ylim(0, 106)  # room for a paper mark near 100%
    ax.set_yticks(range(0, 101, 20))
    ax.tick_params(axis="x", labelrotation=15)


def figure_texts(fig) -> list[str]:
    """Every text a reader sees in a matplotlib figure (titles, axis labels, ticks, legends, notes)."""
    return [a.get_text() for a in fig.findobj(plt.Text) if a.get_text().strip()]
