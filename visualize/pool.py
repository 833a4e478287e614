"""The physical KV pool and the block tables that point into it, drawn from one :class:`StepReport`.

Data first (``pool_blocks``, ``block_table_rows``, ``event_log_rows``: plain lists of dicts the app,
the lessons and the tests can read), then figures: ``pool_map_figure`` (matplotlib, for slides),
``pool_map_chart`` (Altair, with a tooltip per block) and ``block_tables_figure``.
"""

from __future__ import annotations

import altair as alt
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.patches import Rectangle

from engine.core.kv_cache_interface import SLIDING_WINDOW
from engine.report import (ALLOCATE, CACHE_HIT, COPY_ON_WRITE, EVICT, FINISH, FORK, FREE, FREED_CACHED, FREED_OUT_OF_WINDOW,
                           FREED_STILL_SHARED, PREEMPT, PREEMPTED_BY_SWAP, RECOMPUTE_CPU_POOL_FULL, RECOMPUTE_PARTIAL_PREFILL,
                           SPEC_ACCEPT, SPEC_PROPOSE, SPEC_REJECT, SWAP_IN, SWAP_OUT, WRITE, BlockTableSnapshot, StepReport)
from visualize.colors import (CACHED_COLOR, COW_DST_BORDER, COW_SRC_BORDER, EDGE_COLOR, EVICT_COLOR, FREE_COLOR, HIT_COLOR,
                              ROLLBACK_COLOR, SHARED_BORDER, SHARED_COLOR, TOUCHED_COLOR, request_color)
from visualize.i18n import finish_reason_text, t
from visualize.kv_groups import NULL_BLOCK, NULL_COLOR, group_color, group_label
from visualize.prefix import CacheEntries, cache_marks, parent_chain_text, short_hash
from visualize.style import as_svg, use_cjk_font

CELL_W, CELL_H = 0.9, 0.8  # a block's cell inside its 1 x 1 grid square; the gaps separate blocks


def num_blocks_of(report: StepReport, block_size: int) -> int:
    """Blocks in the pool: the report's capacity (slots) divided by the block size, and for a hybrid model
    (several KV cache groups) the null block 0 too, which its pool reserves outside the capacity."""
    return report.memory.capacity // block_size + (1 if report.kv_groups else 0)


def table_snapshots(report: StepReport) -> list[tuple[int | None, BlockTableSnapshot]]:
    """Every block table that holds the step's blocks, with its KV cache group: a hybrid model's tables
    of every group (``report.kv_groups``; ``report.block_tables`` is only the full-attention group's),
    else ``report.block_tables`` with group None."""
    if report.kv_groups:
        return [(g.group_id, snap) for g in report.kv_groups for snap in g.block_tables]
    return [(None, snap) for snap in report.block_tables]


def is_null_entry(report: StepReport, group: int | None, block: int) -> bool:
    """A sliding-window group's table entry freed out of the window: it points at the null block 0."""
    return group is not None and block == NULL_BLOCK and report.kv_groups[group].attention_type == SLIDING_WINDOW


def touched_blocks(report: StepReport) -> set[int]:
    """Physical blocks allocated, written, freed or copied during the step."""
    blocks = {e.block_id for e in report.events if e.block_id is not None and e.kind in (ALLOCATE, WRITE, FREE, COPY_ON_WRITE)}
    return blocks | {e.dst_block_id for e in report.events if e.kind == COPY_ON_WRITE}


def copy_on_write_pairs(report: StepReport) -> list[tuple[int, int, int | None]]:
    """The step's copy-on-writes as ``(src block, dst block, sequence)`` (paper §4.4, Figure 8)."""
    return [(e.block_id, e.dst_block_id, e.seq_id) for e in report.events if e.kind == COPY_ON_WRITE]


def cow_sides(report: StepReport) -> dict[tuple[int, int | None], str]:
    """A block table's entries in this step's copy-on-writes, ``(block, seq_id)`` -> "src" or "dst":
    the new copy in the table of the sequence that wrote, the source in the tables still holding it."""
    sides: dict[tuple[int, int | None], str] = {}
    sources = {src for src, _, _ in copy_on_write_pairs(report)}
    for snap in report.block_tables:
        for b in snap.block_table:
            if b in sources:
                sides[(b, snap.seq_id)] = "src"
    for _, dst, seq in copy_on_write_pairs(report):
        sides[(dst, seq)] = "dst"
    return sides


def speculative_slots(report: StepReport, block_size: int) -> dict[int, dict[str, list[int]]]:
    """Speculative decoding this step, per physical block: ``{"tentative": [...], "rolled_back": [...]}``,
    the offsets (0 .. block_size - 1) of the lookahead slots the drafts were written to, and of those
    given back at rollback (the rejected drafts'). From ``report.spec`` (so a saved run has them too)."""
    out: dict[int, dict[str, list[int]]] = {}
    for spec in getattr(report, "spec", {}).values():
        for key, slots in (("tentative", spec.tentative_slots), ("rolled_back", spec.rolled_back_slots)):
            for slot in slots:
                out.setdefault(slot // block_size, {"tentative": [], "rolled_back": []})[key].append(slot % block_size)
    return out


def pool_blocks(report: StepReport, block_size: int, columns: int = 16, cache: CacheEntries | None = None) -> list[dict]:
    """One row per physical block after the step, in block order.

    Keys: block, row, col (grid position, ``columns`` blocks per row), owner (request id or None),
    group (a hybrid model: the KV cache group whose tables hold it, else None), null (True for a hybrid
    pool's null block 0: never allocated, the entry every table freed out of a sliding window points at),
    logical_index (its index in the owner's block table), filled (slots holding token states),
    block_size, touched (allocated / written / freed this step), owners (every request with slots
    in it: a contiguous range need not start on a block boundary, so two may share a block),
    holders (every ``(request id, sequence id)`` whose block table holds it), ref_count (its
    reference count: > 1 when sequences share it, paper §4.4), cow ("src" / "dst" when it was the
    source or the new copy of a copy-on-write this step, else None), cached_hash (prefix caching: a
    free block that still holds cached KV, evictable, has its block hash here, else None),
    block_hash (any cached block, in use or free: its hash, hex; from ``cache``, vLLM's block hash),
    cache_mark ("hit": a prompt found it cached this step; "evict": its hash was dropped this step; else ""),
    tentative (speculative decoding: the block's lookahead slots that held draft tokens this step, as
    offsets in the block), rolled_back (those of them given back at rollback: the rejected drafts').

    ``cache``: ``PrefixCache.entries()`` after the step (block -> (hash, parent hash)); without it
    (a saved run) only the free cached blocks' hashes are known, from the report.
    """
    blocks = [
        dict(block=b, row=b // columns, col=b % columns, owner=None, group=None, null=bool(report.kv_groups) and b == NULL_BLOCK,
             logical_index=None, filled=0,
             block_size=block_size, touched=False, owners=[], holders=[], ref_count=0, cow=None,
             cached_hash=getattr(report, "cached_free", {}).get(b), block_hash=None, cache_mark="",
             tentative=[], rolled_back=[])
        for b in range(num_blocks_of(report, block_size))
    ]
    for b, slots in speculative_slots(report, block_size).items():
        if b < len(blocks):
            blocks[b].update(tentative=sorted(slots["tentative"]), rolled_back=sorted(slots["rolled_back"]))
    for b, block in enumerate(blocks):
        block["block_hash"] = cache[b][0] if cache and b in cache else block["cached_hash"]
    for b, mark in cache_marks(report).items():
        if b < len(blocks):
            blocks[b]["cache_mark"] = mark
    for group, snap in table_snapshots(report):
        refs = snap.ref_counts or [1] * len(snap.block_table)
        for logical, (physical, filled, ref) in enumerate(zip(snap.block_table, snap.filled, refs)):
            if is_null_entry(report, group, physical):
                continue
            cell = blocks[physical]
            cell["group"] = group
            if snap.request_id not in cell["owners"]:
                cell["owners"].append(snap.request_id)
            cell["holders"].append((snap.request_id, snap.seq_id))
            cell["ref_count"] = max(cell["ref_count"], ref)
            # The owner shown is the request with the most tokens here (the first one if tied).
            if cell["owner"] is None or filled > cell["filled"]:
                cell.update(owner=snap.request_id, logical_index=logical, filled=filled)
    for b in touched_blocks(report):
        if b < len(blocks):
            blocks[b]["touched"] = True
    for src, dst, _ in copy_on_write_pairs(report):
        blocks[src]["cow"], blocks[dst]["cow"] = "src", "dst"
    return blocks


def pool_frame(report: StepReport, block_size: int, lang: str = "en", columns: int = 16,
               cache: CacheEntries | None = None) -> pd.DataFrame:
    """``pool_blocks`` as a DataFrame with the drawing coordinates, colours and tooltip texts."""
    blocks = pool_blocks(report, block_size, columns, cache)
    df = pd.DataFrame(blocks).drop(columns=["owners", "holders", "cached_hash", "block_hash", "tentative", "rolled_back", "group"])
    df["x"], df["x2"] = df["col"], df["col"] + CELL_W
    df["fill_x2"] = df["col"] + CELL_W * df["filled"].where(~df["null"], block_size) / block_size  # the null block solid
    df["y"], df["y2"] = df["row"], df["row"] + CELL_H
    # Computed from the plain rows: pandas turns a column of ints and Nones into floats.
    df["color"] = [_block_color(report, b) for b in blocks]
    groups = {g.group_id: group_label(g, lang) for g in report.kv_groups}
    df["owner_text"] = [t("null_block_text", lang) if b["null"] else
                        (t("sep_list", lang).join(f"{t('request', lang)} {o}" for o in b["owners"])
                         + (f" · {groups[b['group']]}" if b["group"] is not None else ""))
                        or (t("cached_free", lang, hash=b["cached_hash"][:8]) if b["cached_hash"] else t("free", lang)) for b in blocks]
    df["label"] = ["∅" if b["null"] else str(b["block"]) for b in blocks]
    df["logical_text"] = [str(b["logical_index"]) if b["owner"] is not None else "–" for b in blocks]
    df["held_text"] = [f"{b['filled']} / {block_size}" for b in blocks]
    df["touched_text"] = ["✓" if b["touched"] else t("no", lang) for b in blocks]
    df["holders_text"] = [t("sep_list", lang).join(t("seq_of_request", lang, seq=sq, request=r) for r, sq in b["holders"]) or "–" for b in blocks]
    df["ref_text"] = [str(b["ref_count"]) for b in blocks]
    df["badge"] = [f"×{b['ref_count']}" if b["ref_count"] > 1 else "" for b in blocks]
    copies: dict[int, list[int]] = {}  # one source may be copied for several writers
    cow_text = {}
    for src, dst, _ in copy_on_write_pairs(report):
        copies.setdefault(src, []).append(dst)
        cow_text[dst] = t("cow_dst", lang, src=src)
    cow_text.update({src: t("cow_src", lang, dst=t("sep_list", lang).join(map(str, dsts))) for src, dsts in copies.items()})
    df["cow"] = [b["cow"] or "" for b in blocks]
    df["cow_text"] = [cow_text.get(b["block"], "–") for b in blocks]
    df["hash_text"] = [short_hash(b["block_hash"]) or "–" for b in blocks]
    df["parent_text"] = [parent_chain_text(b["block"], cache, lang) if cache and b["block"] in cache else "–" for b in blocks]
    df["mark_text"] = [t(f"mark_{b['cache_mark']}", lang) if b["cache_mark"] else "" for b in blocks]
    # speculative decoding: the slot range of the drafts (tentative) and of the slots given back, inside the cell
    for key in ("tentative", "rolled_back"):
        df[f"{key}_count"] = [len(b[key]) for b in blocks]
        df[f"{key}_x"] = [b["col"] + CELL_W * min(b[key]) / block_size if b[key] else b["col"] for b in blocks]
        df[f"{key}_x2"] = [b["col"] + CELL_W * (max(b[key]) + 1) / block_size if b[key] else b["col"] for b in blocks]
    df["spec_text"] = [t("spec_block_text", lang, tentative=len(b["tentative"]), rolled_back=len(b["rolled_back"]))
                       if b["tentative"] else "–" for b in blocks]
    return df


def _block_color(report: StepReport, block: dict) -> str:
    """A block's colour on the pool map: its KV cache group's (a hybrid model: as in the KV cache groups
    view), the null block's, a free cached block's, else its owner's (free: grey)."""
    if block["null"]:
        return NULL_COLOR
    if block["group"] is not None:
        return group_color(report, block["group"])
    return CACHED_COLOR if block["cached_hash"] and block["owner"] is None else request_color(block["owner"])


def pool_map_spec(report: StepReport, block_size: int, lang: str = "en", columns: int = 16,
                  cache: CacheEntries | None = None) -> dict:
    """The interactive pool map as a Vega-Lite spec (a plain dict, built in about a millisecond:
    the app redraws it every step, and building the same chart through Altair's objects and schema
    validation took 0.3-0.8 s on a 2-core laptop).

    A cell per block in its owner's colour, the filled part darker, blocks touched this step outlined
    in black; hovering a block names its owner, logical index and tokens held (and, prefix caching,
    its block hash and parent chain). A dot marks a cache hit this step, a cross an eviction (legend below).
    """
    df = pool_frame(report, block_size, lang, columns, cache)
    rows = int(df["row"].max()) + 1
    records = df.drop(columns=["owner", "logical_index"]).to_dict(orient="records")
    x = {"field": "x", "type": "quantitative", "axis": None, "scale": {"domain": [0, columns]}}
    y = {"field": "y", "type": "quantitative", "axis": None, "scale": {"domain": [0, rows], "reverse": True}}
    box = {"x": x, "x2": {"field": "x2"}, "y": y, "y2": {"field": "y2"}}
    color = {"field": "color", "type": "nominal", "scale": None}
    tooltip = [
        {"field": "block", "type": "quantitative", "title": t("block", lang)},
        {"field": "owner_text", "type": "nominal", "title": t("owner", lang)},
        {"field": "logical_text", "type": "nominal", "title": t("logical_index", lang)},
        {"field": "held_text", "type": "nominal", "title": t("tokens_held", lang)},
        {"field": "touched_text", "type": "nominal", "title": t("touched", lang)},
        {"field": "ref_text", "type": "nominal", "title": t("ref_count", lang)},
        {"field": "holders_text", "type": "nominal", "title": t("holders", lang)},
        {"field": "cow_text", "type": "nominal", "title": t("copy_on_write", lang)},
        {"field": "hash_text", "type": "nominal", "title": t("block_hash", lang)},
        {"field": "parent_text", "type": "nominal", "title": t("parent_chain", lang)},
        {"field": "spec_text", "type": "nominal", "title": t("spec_slots", lang)},
    ]
    marks = [t("mark_hit", lang), t("mark_evict", lang)]
    caching = getattr(report, "prefix_cache", None) is not None  # the marks and their legend only with prefix caching
    layers = [
        # the whole block, pale: allocated-but-empty slots show as the pale part
        {"mark": {"type": "rect", "opacity": 0.35, "stroke": EDGE_COLOR, "strokeWidth": 0.5},
         "encoding": {**box, "color": color, "tooltip": tooltip}},
        # the filled slots, solid
        {"transform": [{"filter": "datum.filled > 0 || datum.null"}], "mark": {"type": "rect"},
         "encoding": {**box, "x2": {"field": "fill_x2"}, "color": color, "tooltip": tooltip}},
        # touched this step: a black outline
        {"transform": [{"filter": "datum.touched"}],
         "mark": {"type": "rect", "fillOpacity": 0, "stroke": TOUCHED_COLOR, "strokeWidth": 2.5},
         "encoding": {**box, "tooltip": tooltip}},
        # shared (refcount > 1): a dotted border; copy-on-write this step: the source dashed, the new copy
        # solid, both in the COW colour (a dash per layer, not a strokeDash scale: layers share scales,
        # and the swap marks add one too)
        *({"transform": [{"filter": test}],
           "mark": {"type": "rect", "fillOpacity": 0, "stroke": color, "strokeWidth": width, "strokeDash": dash},
           "encoding": {**box, "tooltip": tooltip}}
          for test, (color, _, dash, _), width in (("datum.ref_count > 1 && !datum.cow", SHARED_BORDER, 2),
                                                    ("datum.cow == 'src'", COW_SRC_BORDER, 3), ("datum.cow == 'dst'", COW_DST_BORDER, 3))),
        # speculative decoding: the drafts' lookahead slots, tentative, as a pale dashed band over their
        # slot range; the slots given back at rollback outlined (dashed, in the rollback colour)
        {"transform": [{"filter": "datum.tentative_count > 0"}],
         "mark": {"type": "rect", "color": "#ffffff", "opacity": 0.55, "stroke": EDGE_COLOR, "strokeWidth": 1.5, "strokeDash": [2, 2]},
         "encoding": {**box, "x": {**x, "field": "tentative_x"}, "x2": {"field": "tentative_x2"}, "tooltip": tooltip}},
        {"transform": [{"filter": "datum.rolled_back_count > 0"}],
         "mark": {"type": "rect", "fillOpacity": 0, "stroke": ROLLBACK_COLOR, "strokeWidth": 2.5, "strokeDash": [3, 2]},
         "encoding": {**box, "x": {**x, "field": "rolled_back_x"}, "x2": {"field": "rolled_back_x2"}, "tooltip": tooltip}},
        # shared (refcount > 1): a "×n" badge in the block's corner
        {"transform": [{"filter": "datum.badge != ''"}, {"calculate": f"datum.x + {CELL_W - 0.05}", "as": "bx"},
                       {"calculate": "datum.y + 0.22", "as": "by"}],
         "mark": {"type": "text", "fontSize": 8, "fontWeight": "bold", "align": "right", "color": SHARED_COLOR},
         "encoding": {"x": {**x, "field": "bx"}, "y": {**y, "field": "by"}, "text": {"field": "badge", "type": "nominal"},
                      "tooltip": tooltip}},
        # prefix caching this step: a dot on a block hit, a cross on a block evicted (with the legend)
        *([{"transform": [{"filter": "datum.mark_text != ''"}, {"calculate": "datum.x + 0.16", "as": "mx"},
                       {"calculate": "datum.y + 0.2", "as": "my"}],
         "mark": {"type": "point", "filled": True, "size": 45, "opacity": 1},
         "encoding": {"x": {**x, "field": "mx"}, "y": {**y, "field": "my"},
                      "color": {"field": "mark_text", "type": "nominal", "scale": {"domain": marks, "range": [HIT_COLOR, EVICT_COLOR]},
                                "legend": {"title": None, "orient": "bottom", "direction": "horizontal", "labelLimit": 0}},
                      "shape": {"field": "mark_text", "type": "nominal", "scale": {"domain": marks, "range": ["circle", "cross"]}},
                      "tooltip": tooltip}}] if caching else []),
        # the physical block number
        {"transform": [{"calculate": f"datum.x + {CELL_W / 2}", "as": "cx"}, {"calculate": f"datum.y + {CELL_H / 2}", "as": "cy"}],
         "mark": {"type": "text", "fontSize": 9, "color": "#222"},
         "encoding": {"x": {**x, "field": "cx"}, "y": {**y, "field": "cy"}, "text": {"field": "label", "type": "nominal"},
                      "tooltip": tooltip}},
    ]
    return as_svg({
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "data": {"values": records},
        "height": max(60, 34 * rows) + (40 if caching else 0),  # the marks' legend is drawn inside this height
        "layer": layers,
        # the blocks' colours are their own (no scale); the marks' legend has a scale of its own
        "resolve": {"scale": {"color": "independent", "shape": "independent"}},
        "config": {"view": {"strokeWidth": 0}},
    })


def pool_map_chart(report: StepReport, block_size: int, lang: str = "en", columns: int = 16,
                   cache: CacheEntries | None = None) -> alt.LayerChart:
    """:func:`pool_map_spec` as an Altair chart, for notebooks (``chart.save("pool.html")``)."""
    return alt.LayerChart.from_dict(pool_map_spec(report, block_size, lang, columns, cache), validate=False)


def pool_map_figure(report: StepReport, block_size: int, lang: str = "en", columns: int = 16, ax=None):
    """Matplotlib twin of :func:`pool_map_chart` (for slides: ``fig.savefig("pool.png")``): the same
    cells, outlines and cache hit / eviction marks, with a legend for the marks."""
    use_cjk_font()
    df = pool_frame(report, block_size, lang, columns)
    rows = int(df["row"].max()) + 1
    own_figure = ax is None
    if own_figure:
        fig, ax = plt.subplots(figsize=(columns * 0.55, rows * 0.5 + 0.6))
    else:
        fig = ax.figure
    for cell in df.itertuples():
        ax.add_patch(Rectangle((cell.x, cell.y), CELL_W, CELL_H, facecolor=cell.color, alpha=0.35, edgecolor=EDGE_COLOR, lw=0.5))
        if cell.filled or cell.null:
            ax.add_patch(Rectangle((cell.x, cell.y), cell.fill_x2 - cell.x, CELL_H, facecolor=cell.color))
        if cell.touched:
            ax.add_patch(Rectangle((cell.x, cell.y), CELL_W, CELL_H, fill=False, edgecolor=TOUCHED_COLOR, lw=2))
        _share_marks(ax, cell.x, cell.y, cell.ref_count, cell.cow, lang)
        if cell.tentative_count:  # speculative decoding: the drafts' slots hatched, those given back outlined
            ax.add_patch(Rectangle((cell.tentative_x, cell.y), cell.tentative_x2 - cell.tentative_x, CELL_H, facecolor="white",
                                   alpha=0.5, hatch="///", edgecolor=EDGE_COLOR, lw=0.8, ls="--", label=t("legend_tentative", lang)))
        if cell.rolled_back_count:
            ax.add_patch(Rectangle((cell.rolled_back_x, cell.y), cell.rolled_back_x2 - cell.rolled_back_x, CELL_H, fill=False,
                                   edgecolor=ROLLBACK_COLOR, lw=2, ls="--", label=t("legend_rolled_back", lang)))
        if cell.cache_mark:  # prefix caching: a hit (dot) or an eviction (cross) this step
            hit = cell.cache_mark == "hit"
            ax.plot(cell.x + 0.16, cell.y + 0.2, "o" if hit else "X", ms=5, color=HIT_COLOR if hit else EVICT_COLOR,
                    label=cell.mark_text)
        ax.text(cell.x + CELL_W / 2, cell.y + CELL_H / 2, cell.label, ha="center", va="center", fontsize=7)
    ax.set_xlim(0, columns)
    ax.set_ylim(rows, 0)
    ax.set_axis_off()
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))  # one entry per kind of mark
    if handles:
        ax.legend(handles.values(), handles.keys(), loc="upper center", bbox_to_anchor=(0.5, 0), frameon=False, fontsize=8,
                  ncol=1 if max(map(len, handles)) > 30 else 2)  # long labels (speculative decoding): one a row
    ax.set_title(f"{t('pool', lang)} — {t('step_summary', lang, step=report.step)}")
    if own_figure:
        fig.tight_layout()  # the title stood above the figure's top edge
    return fig


def _share_marks(ax, x: float, y: float, ref_count: int, cow: str | None, lang: str) -> None:
    """A block's sharing drawn on a matplotlib cell as on the app's: a copy-on-write's source dashed and
    its copy solid (pink), else a shared block dotted (slate); a shared block's "×n" in its corner."""
    border = {"src": (COW_SRC_BORDER, "legend_cow_src"), "dst": (COW_DST_BORDER, "legend_cow_dst")}.get(cow or "")
    if border is None and ref_count > 1:
        border = (SHARED_BORDER, "legend_shared")
    if border is not None:
        (color, _, _, style), key = border
        ax.add_patch(Rectangle((x, y), CELL_W, CELL_H, fill=False, edgecolor=color, lw=2, ls=style, label=t(key, lang)))
    if ref_count > 1:
        ax.text(x + CELL_W - 0.04, y + 0.2, f"×{ref_count}", ha="right", va="center", fontsize=6, fontweight="bold", color=SHARED_COLOR)


def block_table_rows(report: StepReport) -> list[dict]:
    """One row per (request, logical block): request_id, logical_index, physical_block, filled."""
    return [
        dict(request_id=snap.request_id, logical_index=i, physical_block=b, filled=f)
        for snap in report.block_tables
        for i, (b, f) in enumerate(zip(snap.block_table, snap.filled))
    ]


def block_tables_figure(report: StepReport, block_size: int, lang: str = "en", ax=None):
    """Each live request's block table as a row of boxes: logical index above, physical block inside;
    shared blocks and this step's copy-on-writes outlined as in the app (``_share_marks``), with a legend."""
    use_cjk_font()
    snaps = table_snapshots(report)  # a hybrid model: every group's tables, in the group's colour
    width = max((len(s.block_table) for _, s in snaps), default=1)
    own_figure = ax is None
    if own_figure:
        fig, ax = plt.subplots(figsize=(1.2 + 0.7 * width, 0.6 + 0.6 * max(len(snaps), 1)))
    else:
        fig = ax.figure
    cow = cow_sides(report)
    for row, (group, snap) in enumerate(snaps):
        color = request_color(snap.request_id) if group is None else group_color(report, group)
        name = f"{t('request', lang)} {snap.request_id}" + ("" if group is None else f" · {t('kv_group_short', lang, group=group)}")
        ax.text(-0.2, row + 0.4, name, ha="right", va="center", color=request_color(snap.request_id), fontsize=9)
        refs = snap.ref_counts or [1] * len(snap.block_table)
        for i, (b, f, r) in enumerate(zip(snap.block_table, snap.filled, refs)):
            null = is_null_entry(report, group, b)
            ax.add_patch(Rectangle((i, row), 0.9, 0.8, facecolor=NULL_COLOR if null else color,
                                   alpha=1 if null else 0.25 + 0.75 * f / block_size, edgecolor=EDGE_COLOR))
            _share_marks(ax, i, row, r, cow.get((b, snap.seq_id)), lang)
            ax.text(i + 0.45, row + 0.4, "∅" if null else str(b), ha="center", va="center", fontsize=8)
    handles = dict(zip(*reversed(ax.get_legend_handles_labels())))
    if handles:
        ax.legend(handles.values(), handles.keys(), loc="upper center", bbox_to_anchor=(0.5, 0), frameon=False, fontsize=8, ncol=1)
    ax.set_xlim(-2.5 if not report.kv_groups else -4, width)
    ax.set_ylim(max(len(snaps), 1), -0.5)
    ax.set_xticks([i + 0.45 for i in range(width)], [str(i) for i in range(width)])
    ax.xaxis.tick_top()
    ax.set_yticks([])
    for side in ("left", "right", "bottom", "top"):
        ax.spines[side].set_visible(False)
    ax.set_title(t("block_tables", lang), pad=18)
    if own_figure:
        fig.tight_layout()  # the title stood above the figure's top edge
    return fig


# PREEMPT's detail (engine/core/scheduler.py) -> its text: swapped out, or recomputed and why.
_PREEMPT_DETAIL = {PREEMPTED_BY_SWAP: "ev_preempt_swap_detail", RECOMPUTE_PARTIAL_PREFILL: "ev_preempt_partial_prefill",
                   RECOMPUTE_CPU_POOL_FULL: "ev_preempt_cpu_full"}


def event_log_rows(report: StepReport, lang: str = "en") -> list[dict]:
    """The step's events for a table: request, event, detail. WRITE events (one per token, hundreds in
    a prefill) are summarised into one row per request, placed where its first write happened."""
    rows: list[dict] = []
    writes: dict[int, dict] = {}
    for e in report.events:
        if e.kind == WRITE:
            if e.request_id not in writes:
                writes[e.request_id] = dict(count=0, first=e.position, last=e.position, blocks=[], slot=e.slot)
                rows.append(dict(request_id=e.request_id, kind=WRITE, detail=writes[e.request_id]))
            w = writes[e.request_id]
            w["count"] += 1
            w["first"], w["last"] = min(w["first"], e.position), max(w["last"], e.position)
            if e.block_id not in w["blocks"]:
                w["blocks"].append(e.block_id)
            continue
        if e.kind == ALLOCATE:
            detail = t("ev_allocate_detail", lang, logical=e.logical_index, block=e.block_id)
        elif e.kind == FREE:
            detail = _free_text(report, e, lang)
        elif e.kind == FORK:
            detail = t("ev_fork_detail", lang, parent=e.parent_seq_id, child=e.seq_id)
        elif e.kind == COPY_ON_WRITE:
            detail = t("ev_copy_on_write_detail", lang, src=e.block_id, dst=e.dst_block_id, seq=e.seq_id, logical=e.logical_index)
        elif e.kind == CACHE_HIT:
            detail = t("ev_cache_hit_detail", lang, logical=e.logical_index, block=e.block_id)
        elif e.kind == EVICT:
            detail = t("ev_evict_detail", lang, block=e.block_id, hash=(e.block_hash or "")[:8])
        elif e.kind in (SWAP_OUT, SWAP_IN):  # swap preemption: block_id is the source, dst_block_id the destination
            detail = t(f"ev_{e.kind}_detail", lang, src=e.block_id, dst=e.dst_block_id, logical=e.logical_index)
        elif e.kind == PREEMPT:
            detail = t(_PREEMPT_DETAIL.get(e.detail, "ev_preempt_detail"), lang)
        elif e.kind == FINISH:
            detail = finish_reason_text(e.detail, lang)
        elif e.kind in (SPEC_PROPOSE, SPEC_ACCEPT, SPEC_REJECT):  # speculative decoding: one row per draft
            token = (e.detail or "").removeprefix("draft token ").split(" ")[0]
            detail = t(f"ev_{e.kind}_detail", lang, token=token, position=e.position, slot=e.slot, block=e.block_id)
        else:
            detail = e.detail
        rows.append(dict(request_id=e.request_id, kind=e.kind, detail=detail))
    for row in rows:
        if row["kind"] == WRITE:
            w = row["detail"]
            blocks = ", ".join(map(str, w["blocks"]))
            if w["count"] == 1:  # a decode step: name the slot, the thing a learner is looking for
                row["detail"] = t("ev_write_one_detail", lang, position=w["first"], slot=w["slot"], block=blocks)
            elif w["first"] == w["last"]:  # a group's decode: each sample or beam writes the same position
                row["detail"] = t("ev_write_same_position_detail", lang, count=w["count"], position=w["first"], blocks=blocks)
            else:
                row["detail"] = t("ev_write_detail", lang, count=w["count"], first=w["first"], last=w["last"], blocks=blocks)
        row["event"] = t(f"ev_{row['kind']}", lang)
    return rows


def _free_text(report: StepReport, e, lang: str) -> str:
    """Why a FREE event's block left its table (its ``detail``), naming a hybrid model's KV cache group."""
    where = dict(logical=e.logical_index, block=e.block_id, seq=e.seq_id)
    if e.detail == FREED_OUT_OF_WINDOW:  # vLLM's remove_skipped_blocks: the window moved past every token in it
        group = report.kv_groups[e.kv_cache_group] if report.kv_groups and e.kv_cache_group is not None else None
        return t("ev_free_window_detail", lang, **where, group=e.kv_cache_group, window=group.sliding_window if group else "?")
    if e.detail.startswith(FREED_STILL_SHARED):  # a shared block: only this sequence's reference goes
        text = t("ev_free_shared_detail", lang, **where)
    elif e.detail == FREED_CACHED:
        text = t("ev_free_cached_detail", lang, **where)
    else:
        text = t("ev_free_detail", lang, **where)
    if report.kv_groups and e.kv_cache_group is not None:
        text = f"{t('kv_group_short', lang, group=e.kv_cache_group)}{t('sep_colon', lang)}{text}"
    return text


def free_queue_cells(report: StepReport, lang: str = "en", max_cells: int = 64) -> list[dict]:
    """The free block queue, head first: the head (least recently used) is allocated, and evicted if
    cached, next (vLLM's free block queue). One dict per block: pos, block, cached (prefix caching:
    it still holds cached KV, evictable), color (cached blocks in their own colour) and state (text).
    Follows the order hit (a cached block leaves the queue) -> allocate (from the head) -> evict."""
    cached = getattr(report, "cached_free", {})
    return [dict(pos=i, block=b, cached=b in cached, color=CACHED_COLOR if b in cached else FREE_COLOR,
                 state=t("cached_free", lang, hash=cached[b][:8]) if b in cached else t("free", lang))
            for i, b in enumerate(report.free_queue[:max_cells])]
