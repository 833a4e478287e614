"""A hybrid model's KV cache groups after a step (``StepReport.kv_groups``, vLLM v1's hybrid KV cache
manager): each group's block tables, the pool coloured by group, and what the sliding window saved
against the same model with every layer full attention.

Plain data in, plain data or a Vega-Lite spec out; the app (``app_pages/kv_groups_panel.py``) draws them.
"""

from __future__ import annotations

import pandas as pd

from engine.core.kv_cache_interface import SLIDING_WINDOW
from engine.core.single_type_kv_cache_manager import NULL_BLOCK
from engine.report import StepReport
from visualize.colors import EDGE_COLOR, FREE_COLOR
from visualize.i18n import t
from visualize.style import as_svg

MIB = 2**20
# Streamlit fits a chart's whole drawing (title, axes, legend) into the spec's height unless told otherwise,
# which left these charts' plots a few pixels tall: fit the width only, the height is the plot's.
FIT_WIDTH = {"type": "fit-x", "contains": "padding"}
# Context lengths the saving is stated at: a short chat's and a long document's (lesson 11 draws the curve).
SAVING_CONTEXTS = (1_200, 32_768)

# One colour per group: sliding-window groups in greens and blues, full attention in orange.
SLIDING_COLORS = ("#2ca02c", "#17becf", "#1f77b4", "#98df8a", "#9edae5", "#aec7e8")
FULL_COLORS = ("#ff7f0e", "#d62728", "#ffbb78")
NULL_COLOR = "#9e9e9e"  # the null block 0 and the table entries that point at it: darker than a free block


def group_color(report: StepReport, group_id: int) -> str:
    """The colour of group ``group_id`` in every view of the step."""
    kinds = [g.attention_type for g in report.kv_groups]
    same = [i for i, k in enumerate(kinds) if k == kinds[group_id]]
    palette = SLIDING_COLORS if kinds[group_id] == SLIDING_WINDOW else FULL_COLORS
    return palette[same.index(group_id) % len(palette)]


def group_label(group, lang: str = "en") -> str:
    """"group 2 · sliding window 512 · layers 7, 8, 9" in ``lang``."""
    kind = (t("kv_sliding_window", lang, window=group.sliding_window) if group.attention_type == SLIDING_WINDOW
            else t("kv_full_attention", lang))
    return t("kv_group_label", lang, group=group.group_id, kind=kind, layers=", ".join(map(str, group.layers)))


def kv_group_rows(report: StepReport) -> list[dict]:
    """One row per (group, sequence, logical block): group, request_id, seq_id, logical_index,
    physical_block, filled (slots), null (True: freed out of the window, the table points at the null block)."""
    return [dict(group=g.group_id, request_id=snap.request_id, seq_id=snap.seq_id, logical_index=i, physical_block=b,
                 filled=f, null=g.attention_type == SLIDING_WINDOW and b == 0)
            for g in report.kv_groups for snap in g.block_tables for i, (b, f) in enumerate(zip(snap.block_table, snap.filled))]


def pool_owner_groups(report: StepReport) -> dict[int, int]:
    """Physical block -> the group whose tables hold it (the null block left out)."""
    return {b: g.group_id for g in report.kv_groups for snap in g.block_tables for b in snap.block_table
            if not (g.attention_type == SLIDING_WINDOW and b == NULL_BLOCK)}


def pool_by_group_spec(report: StepReport, num_blocks: int, lang: str = "en", columns: int = 32) -> dict:
    """The pool as a grid of ``num_blocks`` blocks (the null block 0 included), each coloured by the group
    that holds it (free: grey; the null block: ∅), as a Vega-Lite spec (SVG, so a browser test reads its
    legend). Cells are drawn on quantitative x/x2, y/y2 scales, as the pool map's are."""
    owners = pool_owner_groups(report)
    labels = {g.group_id: group_label(g, lang) for g in report.kv_groups}
    free, null = t("free", lang), t("null_block", lang)
    rows = [dict(block=b, x=b % columns, x2=b % columns + 0.9, y=b // columns, y2=b // columns + 0.8,
                 group=null if b == NULL_BLOCK else labels[owners[b]] if b in owners else free)
            for b in range(num_blocks)]
    domain = [labels[g.group_id] for g in report.kv_groups] + [null, free]
    colors = [group_color(report, g.group_id) for g in report.kv_groups] + [NULL_COLOR, FREE_COLOR]
    num_rows = -(-num_blocks // columns)
    return as_svg({
        "data": {"values": rows}, "height": 14 * num_rows, "title": t("kv_pool_by_group", lang), "autosize": FIT_WIDTH,
        "mark": {"type": "rect", "stroke": EDGE_COLOR, "strokeWidth": 0.3},
        "encoding": {"x": {"field": "x", "type": "quantitative", "axis": None, "scale": {"domain": [0, columns]}}, "x2": {"field": "x2"},
                     "y": {"field": "y", "type": "quantitative", "axis": None, "scale": {"domain": [0, num_rows], "reverse": True}},
                     "y2": {"field": "y2"},
                     "color": {"field": "group", "type": "nominal", "scale": {"domain": domain, "range": colors},
                               "legend": {"title": None, "orient": "bottom", "columns": 2, "labelLimit": 400}},
                     "tooltip": [{"field": "block", "type": "quantitative", "title": t("block", lang)},
                                 {"field": "group", "type": "nominal", "title": t("kv_group", lang)}]},
        "config": {"view": {"strokeWidth": 0}},
    })


def window_savings_frame(reports: list[StepReport], block_size: int = 16) -> pd.DataFrame:
    """One row per step of a hybrid run: ``in_use`` (blocks the groups hold) and ``all_full`` (blocks the
    same tables would hold if every group kept every block, as with all layers full attention: one block
    per table entry, null entries included), and both in MiB (``in_use_mib``, ``all_full_mib``: a block
    is a page of ``block_size`` slots of ``memory.bytes_per_slot`` bytes, one group's layers)."""
    rows = []
    for r in reports:
        if r.kv_groups:
            page = r.memory.bytes_per_slot * block_size / MIB
            in_use = sum(g.num_blocks_in_use for g in r.kv_groups)
            all_full = sum(len(s.block_table) for g in r.kv_groups for s in g.block_tables)
            rows.append(dict(step=r.step, in_use=in_use, all_full=all_full, in_use_mib=in_use * page, all_full_mib=all_full * page))
    return pd.DataFrame(rows, columns=["step", "in_use", "all_full", "in_use_mib", "all_full_mib"])


def window_savings_spec(frame: pd.DataFrame, lang: str = "en") -> dict:
    """Two lines over steps, the KV cache in MiB the groups hold and what the same tables would hold
    with all layers full attention (Vega-Lite, SVG): y from 0, whole steps on x, blocks in the tooltip."""
    names = {"in_use": t("kv_blocks_in_use", lang), "all_full": t("kv_blocks_all_full", lang)}
    long = pd.concat([pd.DataFrame(dict(step=frame["step"], series=names[k], blocks=frame[k], mib=frame[f"{k}_mib"].round(2)))
                      for k in names])
    last = int(frame["step"].max()) if len(frame) else 0
    return as_svg({
        "data": {"values": long.to_dict("records")}, "height": 220, "title": t("kv_window_saved", lang), "autosize": FIT_WIDTH,
        "mark": {"type": "line", "point": True, "strokeWidth": 2.5},
        "encoding": {"x": {"field": "step", "type": "quantitative", "title": t("lc_step", lang),
                           "scale": {"domain": [int(frame["step"].min()) if len(frame) else 0, max(last, 1)]},
                           "axis": {"format": "d", "tickMinStep": 1}},
                     "y": {"field": "mib", "type": "quantitative", "title": t("kv_mib_axis", lang), "scale": {"zero": True}},
                     "color": {"field": "series", "type": "nominal", "title": None,
                               "scale": {"domain": [names["in_use"], names["all_full"]], "range": ["#2ca02c", "#7f7f7f"]},
                               "legend": {"orient": "bottom", "labelLimit": 400}},
                     "tooltip": [{"field": "step", "type": "quantitative", "title": t("lc_step", lang)},
                                 {"field": "series", "type": "nominal", "title": " "},
                                 {"field": "blocks", "type": "quantitative", "title": t("blocks", lang)},
                                 {"field": "mib", "type": "quantitative", "title": "MiB"}]},
    })


def blocks_held(context_len: int, block_size: int, sliding_window: int | None) -> int:
    """Blocks one request of ``context_len`` tokens holds in one group once it decodes: every block with
    full attention (None); with a sliding window, all but the blocks wholly before the next query's
    window, which the group freed (vLLM's ``remove_skipped_blocks``: tokens before
    ``context_len - sliding_window + 1`` are skipped)."""
    blocks = -(-context_len // block_size)
    if sliding_window is None:
        return blocks
    return blocks - max(0, context_len - sliding_window + 1) // block_size


def window_saving_at(report: StepReport, context_len: int, block_size: int) -> float:
    """How many times fewer blocks one request of ``context_len`` tokens holds over ``report``'s groups
    than with every group full attention (Gemma 3 270M: 1.9x at 1,200 tokens, 5.6x at 32K)."""
    held = sum(blocks_held(context_len, block_size, g.sliding_window if g.attention_type == SLIDING_WINDOW else None)
               for g in report.kv_groups)
    return len(report.kv_groups) * -(-context_len // block_size) / held
