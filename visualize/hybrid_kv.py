"""KV memory per request against context length, every layer full attention against Gemma 3's 5:1
pattern of sliding-window and full layers (``engine.experiments.hybrid_kv``, run on the simulator's
hybrid KV cache manager). Compare the Gemma 3 Technical Report's Figure 6 (Gemma Team 2025).

    python -m visualize.hybrid_kv --out docs/figure-hybrid-kv.png [--context-len 32768] [--json]
"""

from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from engine.experiments.hybrid_kv import GEMMA3_270M, kv_memory_vs_context  # noqa: E402
from visualize.style import finish  # noqa: E402

FULL_COLOR, HYBRID_COLOR = "#7f7f7f", "#2ca02c"
MIB = 2**20


def plot_kv_memory_vs_context(rows: list[dict], out: str | None = None):
    """KV MiB of one request against its context length, both curves; returns the figure (saved to
    ``out`` when given)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    lens = [r["context_len"] for r in rows]
    ax.plot(lens, [r["full_bytes"] / MIB for r in rows], "-", color=FULL_COLOR, label="all 18 layers full attention")
    window = GEMMA3_270M["sliding_window"]
    ax.plot(lens, [r["hybrid_bytes"] / MIB for r in rows], "-", color=HYBRID_COLOR,
            label=f"Gemma 3: 15 sliding (window {window}) + 3 full")
    last = rows[-1]
    ax.annotate(f"{last['ratio']:.1f}x less", (last["context_len"], last["hybrid_bytes"] / MIB), textcoords="offset points",
                xytext=(-60, 18), fontsize=8, color=HYBRID_COLOR)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("KV cache of one request (MiB)")
    ax.set_title("Gemma 3 270M, bf16, blocks of 16: KV memory per request")
    return finish(fig, [[ax]], out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m visualize.hybrid_kv", description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="PNG file to write")
    parser.add_argument("--context-len", type=int, default=32_768, help="tokens the request decodes to (default 32768)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    rows = kv_memory_vs_context(context_len=args.context_len)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        for r in rows[:: max(1, len(rows) // 8)] + rows[-1:]:
            print(f"{r['context_len']:>7} tokens  full {r['full_bytes'] / MIB:8.1f} MiB  Gemma 3 {r['hybrid_bytes'] / MIB:7.1f} MiB  "
                  f"{r['ratio']:.2f}x")
    if args.out:
        plot_kv_memory_vs_context(rows, args.out)


if __name__ == "__main__":
    main()
