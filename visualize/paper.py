"""The PagedAttention paper's Figure 2, redrawn from the simulator's ``reproduce_paper`` rows.

One stacked bar per system: token states, reservation, internal fragmentation, and external
fragmentation & other (free memory counts as "other", as in the paper), each as a share of the KV
pool; the paper's token-state share is marked beside ours where the paper gives it.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

from visualize.colors import CATEGORY_COLORS

SEGMENTS = (
    ("token_states", "Token states"),
    ("reserved", "Reservation"),
    ("internal_fragmentation", "Internal frag."),
    ("external_fragmentation", "External frag. & other"),
)


def plot_memory_breakdown(rows: list[dict], out: str | None = None):
    """Stacked bars of each (workload, system) row's memory shares, one panel per workload.

    Args:
        rows: ``engine.simulator.reproduce_paper`` rows (``fragmentation`` holds the shares, 0..1).
        out: save the figure to this path (PNG) when given.

    Returns:
        The matplotlib Figure.
    """
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 4), sharey=True, squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        wrows = [r for r in rows if r["workload"] == workload]
        names = [r["system"] for r in wrows]
        bottom = [0.0] * len(wrows)
        for key, label in SEGMENTS:
            share = [_share(r, key) * 100 for r in wrows]
            ax.bar(names, share, bottom=bottom, color=CATEGORY_COLORS.get(key), label=label, edgecolor="white")
            bottom = [b + s for b, s in zip(bottom, share)]
        for i, r in enumerate(wrows):
            ax.text(i, _share(r, "token_states") * 50, f"{r['token_state_fraction']:.1%}", ha="center", fontsize=8)
            if r.get("paper_token_state_fraction") is not None:
                y = r["paper_token_state_fraction"] * 100
                ax.plot([i - 0.4, i + 0.4], [y, y], color="black", linestyle="--", linewidth=1)
        ax.set_title(f"{workload}: KV cache usage")
        ax.set_ylim(0, 100)
        ax.tick_params(axis="x", labelrotation=20)
    axes[0][0].set_ylabel("share of KV cache (%)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(plt.Line2D([], [], color="black", linestyle="--"))
    labels.append("paper: token states (Fig. 2)")
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    if out:
        fig.savefig(out, dpi=150)
    return fig


def _share(row: dict, key: str) -> float:
    """A row's share of one bar segment; free memory joins external fragmentation as "other"."""
    frag = row["fragmentation"]
    if key == "external_fragmentation":
        return frag["external_fragmentation"] + frag["free"]
    return frag[key]
