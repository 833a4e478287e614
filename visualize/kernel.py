"""The decode kernel's program grid: which Triton program handles which sequence, KV head and
context partition, and which physical blocks it reads through the block table.

The layout follows ``paged_kernels/paged_attention_decode.py`` on a GPU: one program per
(sequence, KV head) pair and per partition of the context (split-K); program id =
``pair * num_splits + partition`` with ``pair = sequence * num_kv_heads + kv_head``. A program
serves the ``num_heads // num_kv_heads`` query heads that share its KV head (grouped-query attention).
Partitions here are ``ceil(max_context / num_splits)`` tokens; the kernel rounds that up to a multiple
of its tile, so its boundaries can sit a little later. A block cut by a boundary is read, in part,
by both programs.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from visualize.colors import EDGE_COLOR, request_color
from visualize.i18n import t
from visualize.style import use_cjk_font


def program_grid(request_ids: list[int], context_lens: list[int], block_tables: list[list[int]],
                 block_size: int, num_heads: int, num_kv_heads: int, num_splits: int = 1) -> list[dict]:
    """One row per program: program, sequence (row in the batch), request_id, kv_head, query_heads,
    partition, tokens [start, end) and blocks (physical blocks it reads, in order)."""
    group = num_heads // num_kv_heads
    max_context = max((len(bt) for bt in block_tables), default=0) * block_size
    # Same partition length as the kernel: the context bound cut in num_splits equal parts.
    per_split = math.ceil(max(max_context, 1) / num_splits)
    programs = []
    for seq, (rid, ctx, table) in enumerate(zip(request_ids, context_lens, block_tables)):
        for kv_head in range(num_kv_heads):
            for part in range(num_splits):
                start, end = part * per_split, min((part + 1) * per_split, ctx)
                blocks = [table[i] for i in range(start // block_size, math.ceil(end / block_size))] if end > start else []
                programs.append(dict(
                    program=(seq * num_kv_heads + kv_head) * num_splits + part, sequence=seq, request_id=rid,
                    kv_head=kv_head, query_heads=list(range(kv_head * group, (kv_head + 1) * group)),
                    partition=part, start=start, end=max(start, end), blocks=blocks,
                ))
    return programs


def program_grid_figure(programs: list[dict], lang: str = "en", ax=None):
    """Rows = sequences, columns = (KV head, partition); each cell shows its program id and blocks read,
    in the colour of the request it works for (empty partitions: white)."""
    use_cjk_font()
    num_seqs = max((p["sequence"] for p in programs), default=-1) + 1
    num_kv = max((p["kv_head"] for p in programs), default=-1) + 1
    splits = max((p["partition"] for p in programs), default=-1) + 1
    cols = num_kv * splits
    if ax is None:
        fig, ax = plt.subplots(figsize=(1.2 + 1.6 * cols, 0.6 + 0.55 * max(num_seqs, 1)))
    else:
        fig = ax.figure
    for p in programs:
        col = p["kv_head"] * splits + p["partition"]
        face = request_color(p["request_id"]) if p["blocks"] else "white"
        ax.add_patch(Rectangle((col, p["sequence"]), 0.95, 0.9, facecolor=face, alpha=0.45, edgecolor=EDGE_COLOR))
        blocks = ",".join(map(str, p["blocks"][:6])) + ("…" if len(p["blocks"]) > 6 else "")
        ax.text(col + 0.47, p["sequence"] + 0.45, f"#{p['program']}\n[{blocks}]", ha="center", va="center", fontsize=7)
    ax.set_xlim(0, max(cols, 1))
    ax.set_ylim(max(num_seqs, 1), 0)
    ax.set_xticks([c + 0.47 for c in range(cols)],
                  [f"{t('kv_head', lang)} {c // splits}" + (f"\n{t('partition', lang)} {c % splits}" if splits > 1 else "") for c in range(cols)],
                  fontsize=8)
    rids = {p["sequence"]: p["request_id"] for p in programs}
    ax.set_yticks([s + 0.45 for s in range(num_seqs)], [f"{t('request', lang)} {rids[s]}" for s in range(num_seqs)], fontsize=8)
    ax.xaxis.tick_top()
    ax.set_title(t("program_grid", lang), pad=28)
    fig.tight_layout()
    return fig
