"""A hybrid model's KV cache groups after a step (``StepReport.kv_groups``, vLLM v1's hybrid KV cache
manager): each group's block tables, the pool coloured by group, and what the sliding window saved
against the same model with every layer full attention.

Plain data in, plain data or a Vega-Lite spec out; the app (``app_pages/kv_groups_panel.py``) draws them.
"""

from __future__ import annotations

import pandas as pd

from engine.core.kv_cache_interface import SLIDING_WINDOW
from engine.report import StepReport
from visualize.colors import FREE_COLOR
from visualize.i18n import t
from visualize.style import as_svg

# One colour per group: sliding-window groups in greens and blues, full attention in orange.
SLIDING_COLORS = ("#2ca02c", "#17becf", "#1f77b4", "#98df8a", "#9edae5", "#aec7e8")
FULL_COLORS = ("#ff7f0e", "#d62728", "#ffbb78")
NULL_COLOR = "#dddddd"


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
            if not (g.attention_type == SLIDING_WINDOW and b == 0)}


def pool_by_group_spec(report: StepReport, num_blocks: int, lang: str = "en", columns: int = 32) -> dict:
    """The pool as a grid of blocks, each coloured by the group that holds it (free: grey), as a
    Vega-Lite spec (SVG, so a browser test reads its legend)."""
    owners = pool_owner_groups(report)
    labels = {g.group_id: group_label(g, lang) for g in report.kv_groups}
    free = t("free", lang)
    rows = [dict(block=b, col=b % columns, row=b // columns, group=labels[owners[b]] if b in owners else free)
            for b in range(num_blocks)]
    domain = [labels[g.group_id] for g in report.kv_groups] + [free]
    colors = [group_color(report, g.group_id) for g in report.kv_groups] + [FREE_COLOR]
    return as_svg({
        "data": {"values": rows}, "height": 12 * (num_blocks // columns + 1), "title": t("kv_pool_by_group", lang),
        "mark": {"type": "rect", "stroke": "white"},
        "encoding": {"x": {"field": "col", "type": "ordinal", "axis": None}, "y": {"field": "row", "type": "ordinal", "axis": None},
                     "color": {"field": "group", "type": "nominal", "scale": {"domain": domain, "range": colors},
                               "legend": {"title": None, "orient": "bottom", "columns": 2, "labelLimit": 400}},
                     "tooltip": [{"field": "block", "title": t("block", lang)}, {"field": "group", "title": t("kv_group", lang)}]},
    })


def window_savings_frame(reports: list[StepReport]) -> pd.DataFrame:
    """One row per step of a hybrid run: ``in_use`` (blocks the groups hold) and ``all_full`` (blocks the
    same tables would hold if every group kept every block, as with all layers full attention: one block
    per table entry, null entries included)."""
    rows = [dict(step=r.step, in_use=sum(g.num_blocks_in_use for g in r.kv_groups),
                 all_full=sum(len(s.block_table) for g in r.kv_groups for s in g.block_tables))
            for r in reports if r.kv_groups]
    return pd.DataFrame(rows, columns=["step", "in_use", "all_full"])


def window_savings_spec(frame: pd.DataFrame, lang: str = "en") -> dict:
    """Two lines over steps, blocks in use and blocks with all layers full attention (Vega-Lite, SVG)."""
    names = {"in_use": t("kv_blocks_in_use", lang), "all_full": t("kv_blocks_all_full", lang)}
    long = frame.melt("step", var_name="series", value_name="blocks").replace({"series": names})
    return as_svg({
        "data": {"values": long.to_dict("records")}, "height": 220, "title": t("kv_window_saved", lang),
        "mark": {"type": "line", "interpolate": "step-after", "point": False},
        "encoding": {"x": {"field": "step", "type": "quantitative", "title": t("lc_step", lang)},
                     "y": {"field": "blocks", "type": "quantitative", "title": t("blocks", lang)},
                     "color": {"field": "series", "type": "nominal", "title": None,
                               "scale": {"domain": [names["in_use"], names["all_full"]], "range": ["#2ca02c", "#7f7f7f"]},
                               "legend": {"orient": "bottom", "labelLimit": 400}}},
    })
