"""The what-if page's figures (Vega-Lite specs, drawn as SVG) from ``engine.sim.whatif.WhatIfResult``.

- :func:`decode_roofline_spec`: decode throughput (tokens/s) against the batch, one roofline for the
  whole step (the weights and every request's KV against its FLOPs), with the ridge point (where the
  step turns compute-bound; none when the KV reads keep it memory-bound) and the batch each allocator's
  KV memory allows;
- :func:`systems_spec`: paged and contiguous side by side: requests that fit, and the simulator's
  throughput (requests/s, the rate where the queue explodes).
"""

from __future__ import annotations

from visualize.i18n import t
from visualize.paper import PAPER_SYSTEM_OF, SYSTEM_COLORS
from visualize.style import as_svg

RESERVATION_NAMES = {"max": "Max", "pow2": "Pow2", "oracle": "Oracle"}


def system_name(system: str, lang: str) -> str:
    """"paged" or a contiguous reservation ("max", "pow2", "oracle") in the reader's language."""
    if system == "paged":
        return t("system_paged", lang)
    return t("system_contiguous", lang, reservation=RESERVATION_NAMES[system])


def _color(result, lang: str) -> dict:
    names = [system_name(s.system, lang) for s in result.systems]
    colors = [SYSTEM_COLORS[PAPER_SYSTEM_OF["paged" if s.system == "paged" else f"contiguous ({s.system})"]] for s in result.systems]
    return {"field": "system", "type": "nominal", "title": t("system_axis", lang), "scale": {"domain": names, "range": colors},
            "legend": {"labelLimit": 0, "orient": "bottom"}}


def decode_roofline_spec(result, lang: str = "en") -> dict:
    """Tokens/s of one decode step against the batch (log axes), ``result.decode_curve``; a dashed rule
    at ``result.ridge_batch`` (none when the step is memory-bound at every batch); a point per allocator
    at the batch its KV memory allows. Data: the line's rows in the first layer's ``data.values``
    (batch, tokens_per_s), the rule's in the second's (batch, label; empty without a ridge), the points'
    in the third's (system, batch, tokens_per_s)."""
    curve = [{"batch": r["batch"], "tokens_per_s": r["tokens_per_s"]} for r in result.decode_curve]
    points = [{"system": system_name(s.system, lang), "batch": s.batch, "tokens_per_s": s.decode_tokens_per_s}
              for s in result.systems if s.batch > 0]
    x = {"field": "batch", "type": "quantitative", "title": t("whatif_batch_axis", lang), "scale": {"type": "log"}}
    y = {"field": "tokens_per_s", "type": "quantitative", "title": t("whatif_tokens_axis", lang), "scale": {"type": "log"}}
    ridge = [{"batch": result.ridge_batch, "label": t("whatif_ridge_label", lang, batch=result.ridge_batch)}] if result.ridge_batch else []
    return as_svg({
        "title": t("whatif_roofline_title", lang),
        "layer": [
            {"data": {"values": curve}, "mark": {"type": "line", "color": "#555555"}, "encoding": {"x": x, "y": y}},
            {"data": {"values": ridge}, "layer": [
                {"mark": {"type": "rule", "strokeDash": [6, 4], "color": "#2ca02c"}, "encoding": {"x": {**x, "field": "batch"}}},
                {"mark": {"type": "text", "align": "right", "dx": -4, "dy": 8, "baseline": "top", "color": "#2ca02c", "y": 0},
                 "encoding": {"x": {**x, "field": "batch"}, "text": {"field": "label"}}},
            ]},
            {"data": {"values": points}, "mark": {"type": "point", "filled": True, "size": 120, "tooltip": True},
             "encoding": {"x": x, "y": y, "color": _color(result, lang)}},
        ],
    })


def systems_spec(result, lang: str = "en") -> dict:
    """Two bar charts side by side, one bar per allocator: the requests its KV slots hold at once
    (``requests_fit``) and the simulator's throughput in requests/s (``sim_requests_per_s``). Data: the
    top-level ``data.values`` rows (system, requests_fit, requests_per_s)."""
    rows = [{"system": system_name(s.system, lang), "requests_fit": s.requests_fit, "requests_per_s": round(s.sim_requests_per_s, 2)}
            for s in result.systems]
    y = {"field": "system", "type": "nominal", "title": None, "sort": None, "axis": {"labelLimit": 0}}

    def bars(field: str, title: str, fmt: str) -> dict:
        x = {"field": field, "type": "quantitative", "title": title}
        return {"width": 260, "layer": [
            {"mark": {"type": "bar", "tooltip": True}, "encoding": {"y": y, "x": x, "color": {**_color(result, lang), "legend": None}}},
            {"mark": {"type": "text", "align": "left", "dx": 3}, "encoding": {"y": y, "x": x, "text": {"field": field, "format": fmt}}},
        ]}

    return as_svg({"data": {"values": rows}, "hconcat": [bars("requests_fit", t("whatif_fit_axis", lang), ",d"),
                                                          bars("requests_per_s", t("whatif_rate_axis", lang), ",.2f")],
                   "title": t("whatif_systems_title", lang)})


GOODPUT_SLOS = ("both", "ttft", "tpot")  # engine.sim.disagg.attainment's keys, solid then dashed lines


def deployment_name(row: dict, lang: str) -> str:
    """A sweep row's deployment in the reader's language: "1P1D disaggregated", "2 colocated instances"."""
    if row["disaggregated"]:
        return t("goodput_label_disagg", lang, label=row["label"])
    return t("goodput_label_colocated", lang, n=row["label"].rstrip("C"))


def goodput_spec(result: dict, lang: str = "en") -> dict:
    """SLO attainment against the request rate (``engine.sim.whatif.goodput_of``'s sweep): one colour per
    deployment, a solid line for the share within both SLOs and dashed ones for each alone; a dashed rule
    at the target share. Data: the first layer's ``data.values`` rows (deployment, slo, rate, share), the
    rule's in the second's (share, label). No height: Streamlit's ``st.vega_lite_chart(..., height=)`` sets it."""
    slo_names = {k: t(f"goodput_slo_{k}", lang) for k in GOODPUT_SLOS}
    rows = [{"deployment": deployment_name(d, lang), "slo": slo_names[k], "rate": rate, "share": round(share, 4)}
            for d in result["deployments"] for k in GOODPUT_SLOS for rate, share in zip(result["rates"], d["attainment"][k])]
    names = [deployment_name(d, lang) for d in result["deployments"]]
    target = result["slo"]["target"]
    x = {"field": "rate", "type": "quantitative", "title": t("goodput_rate_axis", lang)}
    y = {"field": "share", "type": "quantitative", "title": t("goodput_share_axis", lang), "axis": {"format": "%"},
         "scale": {"domain": [0, 1]}}
    return as_svg({
        "title": t("goodput_chart_title", lang),
        "layer": [
            {"data": {"values": rows}, "mark": {"type": "line", "point": True, "tooltip": True},
             "encoding": {"x": x, "y": y,
                          "color": {"field": "deployment", "type": "nominal", "title": t("goodput_deployment_axis", lang),
                                    "scale": {"domain": names, "range": ["#d62728", "#1f77b4"]}, "legend": {"labelLimit": 0}},
                          "strokeDash": {"field": "slo", "type": "nominal", "title": t("goodput_slo_axis", lang),
                                         "scale": {"domain": list(slo_names.values()), "range": [[1, 0], [6, 3], [2, 2]]},
                                         "legend": {"labelLimit": 0}},
                          "opacity": {"condition": {"test": f"datum.slo === {slo_names['both']!r}", "value": 1}, "value": 0.45}}},
            {"data": {"values": [{"share": target, "label": t("goodput_target_label", lang, target=target)}]}, "layer": [
                {"mark": {"type": "rule", "strokeDash": [4, 4], "color": "#555555"}, "encoding": {"y": {**y, "field": "share"}}},
                {"mark": {"type": "text", "align": "left", "dx": 4, "dy": -6, "x": 0, "color": "#555555"},
                 "encoding": {"y": {**y, "field": "share"}, "text": {"field": "label"}}},
            ]},
        ],
    })
