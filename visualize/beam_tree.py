"""A beam-search request as a tree over the steps, drawn from its step reports (paper §4.4, Figure 9).

Each step's live beams are nodes (x: step, y: the beam's rank); an edge joins a beam to the one it
continues or was forked from. A beam that does not survive a step is *pruned*: its last node is grey,
with no edge leaving it, and lists the blocks whose references it gave back (FREE events), blocks that
return to the free list once no other beam holds them. The blocks a beam shares with others are the ones with refcount > 1
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

    A beam is pruned in step s when none of its candidates is among the best ``beam_width``: it
    holds blocks after step s-1 and none after step s. It is drawn where it died, at its last live
    position (step s-1, its rank then), so a pruned node never has a line leaving it and never sits
    on a live beam.

    Returns:
        nodes: one per (step, live beam): step, seq_id, rank, shared_blocks (blocks of its table
            with refcount > 1), blocks (its table length), pruned (True for a beam's last node when
            it was pruned in the next step), pruned_step (that step, or None), freed (the blocks
            whose references it gave back then: FREE events, back on the free list once no other
            beam holds them).
        edges: step, from_rank (the parent's rank in the step before), to_rank, seq_id, forked.
    """
    nodes, edges, previous = [], [], {}  # previous: seq_id -> its node in the step before
    for report in reports:
        tables = sorted((b for b in report.block_tables if b.request_id == request_id), key=lambda b: b.index)
        parent = {e.seq_id: e.parent_seq_id for e in report.events if e.kind == FORK and e.request_id == request_id}
        current = {}
        for b in tables:
            node = dict(step=report.step, seq_id=b.seq_id, rank=b.index, shared_blocks=sum(1 for r in b.ref_counts if r > 1),
                        blocks=len(b.block_table), pruned=False, pruned_step=None, freed=[])
            nodes.append(node)
            current[b.seq_id] = node
            source = parent.get(b.seq_id, b.seq_id)
            if source in previous:
                edges.append(dict(step=report.step, from_rank=previous[source]["rank"], to_rank=b.index, seq_id=b.seq_id,
                                  forked=b.seq_id in parent))
        if current:  # the search goes on (at its end, or a preemption, every beam leaves at once)
            for seq_id, node in previous.items():
                if seq_id not in current:
                    node.update(pruned=True, pruned_step=report.step, freed=[
                        e.block_id for e in report.events if e.kind == FREE and e.request_id == request_id and e.seq_id == seq_id])
        previous = current
    return nodes, edges


def beam_tree_spec(reports: list[StepReport], request_id: int, lang: str = "en") -> dict:
    """The beam tree as a Vega-Lite spec: live beams in the request's colour, pruned ones grey with
    a tooltip naming the blocks they gave back, forks as edges in the sharing colour."""
    nodes, edges = beam_tree_rows(reports, request_id)
    color = request_color(request_id)
    for n in nodes:
        n["state"] = t("beam_pruned", lang, step=n["pruned_step"]) if n["pruned"] else t("beam_live", lang)
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
