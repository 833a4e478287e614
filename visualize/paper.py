"""The PagedAttention paper's figures, redrawn from the simulator's plain results.

Figure 2 (``plot_memory_breakdown``): one stacked bar per system: token states, reservation,
internal fragmentation, and external fragmentation & other (free memory counts as "other", as in
the paper), each as a share of the KV pool; the paper's token-state share is marked beside ours.
Figures 12, 13 and 18b: from ``engine.paper_experiments`` results (``save_paper_figure``), the
paper's numbers marked beside ours.
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


SYSTEM_COLORS = {"Orca (Max)": "#d62728", "Orca (Pow2)": "#ff7f0e", "Orca (Oracle)": "#9467bd", "vLLM": "#1f77b4"}


def plot_latency_vs_rate(result: dict, out: str | None = None):
    """Figure 12: normalized latency (s/token) against request rate, one panel per workload, a
    dotted line at each system's sustainable rate; the paper's ratio range in the title."""
    rows = result["rows"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = _panels(len(workloads), 4.8)
    for ax, workload in zip(axes[0], workloads):
        for system, color in SYSTEM_COLORS.items():
            mine = [r for r in rows if r["workload"] == workload and r["system"] == system]
            ax.plot([r["request_rate"] for r in mine], [r["normalized_latency_s"] for r in mine], "o-", color=color,
                    label=system, markersize=4)
            s = next(x for x in result["sustainable"] if x["workload"] == workload and x["system"] == system)
            if s["reached"]:
                ax.axvline(s["rate"], color=color, linestyle=":", linewidth=1)
        ratios = [r for r in result["ratios"] if r["workload"] == workload and r["paper"]]
        paper = "; ".join(f"vs {r['baseline']}: {r['ratio']:.1f}x (paper {r['paper'][0]:g}-{r['paper'][1]:g}x)" for r in ratios)
        ax.set_title(f"{workload}" + (f"\n{paper}" if paper else ""), fontsize=9)
        ax.set_xlabel("request rate (req/s)")
        ax.set_ylabel("normalized latency (s/token)")
        ax.set_yscale("log")
    return _finish(fig, axes, out)


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
    return _finish(fig, axes, out)


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
    return _finish(fig, axes, out)


def _panels(n: int, width: float = 4.4):
    return plt.subplots(1, n, figsize=(width * n, 3.8), squeeze=False)


def _finish(fig, axes, out: str | None):
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    if out:
        fig.savefig(out, dpi=150)
    return fig


def save_paper_figure(figure: str, result, out: str):
    """Draw one ``python -m engine reproduce-paper`` result ("memory", "2", "12", "13", "18b") to ``out``."""
    draw = {"memory": plot_memory_breakdown, "2": plot_memory_breakdown, "12": plot_latency_vs_rate,
            "13": plot_batched_requests, "18b": plot_block_size}
    fig = draw[figure](result, out)
    plt.close(fig)
    return out
