"""Figure 19 (PagedAttention paper §7.3), redrawn from ``engine.experiments.swap.figure_19``'s result:
(a) the cost of one preemption by swap (in + out) and by recompute against block size; (b) the
normalized latency of serving ShareGPT with each, against block size."""

from __future__ import annotations

import matplotlib.pyplot as plt

from visualize.style import finish

SWAP_COLOR, RECOMPUTE_COLOR = "#d62728", "#1f77b4"


def plot_swap_vs_recompute(result: dict, out: str | None = None):
    """Two panels, block size on a log2 axis; returns the figure (saved to ``out`` when given)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9.6, 3.8))
    sizes = [r["block_size"] for r in result["a"]]
    a.plot(sizes, [r["swap_ms"] for r in result["a"]], "o-", color=SWAP_COLOR, label="swap in + out")
    a.plot(sizes, [r["recompute_ms"] for r in result["a"]], "s-", color=RECOMPUTE_COLOR, label="recompute")
    a.set_title(f"(a) one preemption of {result['tokens_per_preemption']} tokens")
    a.set_ylabel("time (ms)")
    for mode, color, marker in (("swap", SWAP_COLOR, "o"), ("recompute", RECOMPUTE_COLOR, "s")):
        rows = [r for r in result["b"] if r["mode"] == mode]
        b.plot([r["block_size"] for r in rows], [r["normalized_latency_s"] for r in rows], f"{marker}-", color=color, label=mode)
    b.set_title(f"(b) ShareGPT at {result['request_rate']:g} req/s")
    b.set_ylabel("normalized latency (s/token)")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size (tokens)")
    b.legend(fontsize=8)
    return finish(fig, [[a, b]], out)  # a's legend, layout, saved to out
