"""A beam-search request as a tree over the steps, drawn from its step reports (paper §4.4, Figure 9).

Each step's live beams are nodes (x: step, y: the beam's rank); an edge joins a beam to the one it
continues or was forked from. A beam that does not survive a step is *pruned*: its node is grey and
lists the blocks whose references it gave back (FREE events), blocks that return to the free list
once no other beam holds them. The blocks a beam shares with others are the ones with refcount > 1
in its block table.

Data first (``beam_tree_rows``: plain dicts the app, lessons and tests can read), then
``beam_tree_spec`` (a Vega-Lite dict for ``st.vega_lite_chart``).
"""

from __future__ import annotations

from engine.report import FORK, FREE, StepReport
from visualize.colors import COW_COLOR, FREE_COLOR, request_color
from visualize.i18n import t
from visualize.style import as_svg


def beam_tree_rows(reports: list[StepReport], request_id: int) -> tuple[list[dict], list[dict]]:
    """Nodes and edges of one request's beam tree.

    Returns:
        nodes: one per (step, live beam): step, seq_id, rank, shared_blocks (blocks of its table
            with refcount > 1), blocks (its table length), pruned (False), freed ([]); plus one per
            beam pruned in a step: the same keys with pruned True and ``freed`` the blocks it let go.
        edges: step, from_rank (the parent's rank in the step before), to_rank, seq_id, forked.
    """
    nodes, edges, previous = [], [], {}
    for report in reports:
        tables = [b for b in report.block_tables if b.request_id == request_id]
        live = {b.seq_id: b for b in tables}
        parent = {e.seq_id: e.parent_seq_id for e in report.events if e.kind == FORK and e.request_id == request_id}
        for b in sorted(tables, key=lambda b: b.index):
            shared = sum(1 for r in b.ref_counts if r > 1)
            nodes.append(dict(step=report.step, seq_id=b.seq_id, rank=b.index, shared_blocks=shared,
                              blocks=len(b.block_table), pruned=False, freed=[]))
            source = parent.get(b.seq_id, b.seq_id)
            if source in previous:
                edges.append(dict(step=report.step, from_rank=previous[source], to_rank=b.index, seq_id=b.seq_id,
                                  forked=b.seq_id in parent))
        freed: dict[int, list[int]] = {}
        for e in report.events:
            if e.kind == FREE and e.request_id == request_id and e.seq_id in previous and e.seq_id not in live:
                freed.setdefault(e.seq_id, []).append(e.block_id)
        if live:
            for seq_id, blocks in freed.items():
                nodes.append(dict(step=report.step, seq_id=seq_id, rank=previous[seq_id], shared_blocks=0,
                                  blocks=0, pruned=True, freed=blocks))
        previous = {seq_id: b.index for seq_id, b in live.items()}
    return nodes, edges


def beam_tree_spec(reports: list[StepReport], request_id: int, lang: str = "en") -> dict:
    """The beam tree as a Vega-Lite spec: live beams in the request's colour, pruned ones grey with
    a tooltip naming the blocks they gave back, forks as edges in the sharing colour."""
    nodes, edges = beam_tree_rows(reports, request_id)
    color = request_color(request_id)
    for n in nodes:
        n["state"] = t("beam_pruned", lang) if n["pruned"] else t("beam_live", lang)
        n["color"] = FREE_COLOR if n["pruned"] else color
        n["freed_text"] = ", ".join(map(str, n["freed"])) or "–"
    for e in edges:
        e["from_step"] = e["step"] - 1
        e["color"] = COW_COLOR if e["forked"] else color
    step_title, beam_title = t("beam_tree_step", lang), t("beam_tree_beam", lang)
    tooltip = [
        {"field": "step", "type": "quantitative", "title": step_title},
        {"field": "seq_id", "type": "quantitative", "title": "seq"},
        {"field": "state", "type": "nominal", "title": t("beam_tree_beam", lang)},
        {"field": "shared_blocks", "type": "quantitative", "title": t("ref_count", lang) + " > 1"},
        {"field": "freed_text", "type": "nominal", "title": t("block", lang)},
    ]
    x = {"type": "quantitative", "title": step_title, "axis": {"tickMinStep": 1}}
    y = {"type": "quantitative", "title": beam_title, "scale": {"reverse": True}, "axis": {"tickMinStep": 1}}
    return as_svg({
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": t("beam_tree_title", lang),
        "height": 60 + 40 * (1 + max((n["rank"] for n in nodes), default=0)),
        "layer": [
            {"data": {"values": edges}, "mark": {"type": "rule", "strokeWidth": 2},
             "encoding": {"x": {**x, "field": "from_step"}, "x2": {"field": "step"}, "y": {**y, "field": "from_rank"},
                          "y2": {"field": "to_rank"}, "color": {"field": "color", "type": "nominal", "scale": None}}},
            {"data": {"values": nodes}, "mark": {"type": "circle", "size": 160, "opacity": 1, "stroke": "#333"},
             "encoding": {"x": {**x, "field": "step"}, "y": {**y, "field": "rank"},
                          "color": {"field": "color", "type": "nominal", "scale": None}, "tooltip": tooltip}},
        ],
    })
