"""Two runs of the same workload, step by step: the lab's engine beside real vLLM (engine/vllm_bridge/replay.py's series)."""

from __future__ import annotations

from visualize.style import as_svg

SIDE_COLORS = ("#1f77b4", "#ff7f0e")  # the lab's engine, vLLM


def step_series_spec(series: dict[str, list[float]], title: str, y_title: str, x_title: str, counts: bool = False) -> dict:
    """A Vega-Lite spec of one per-step measure of each run: a step line per label (first the lab's,
    drawn wide, then vLLM's, dashed on top, so that equal runs still show both). Step i is the i-th
    step that ran, counted from 0 as on the Live engine page; the data are ``data.values`` rows
    {"step", "value", "side"}. No height:
    Streamlit's ``st.vega_lite_chart(..., height=)`` sets it (a height in the spec is squeezed).
    ``counts``: whole numbers on the y axis (requests, preemptions)."""
    values = [{"step": i, "value": v, "side": label} for label, vs in series.items() for i, v in enumerate(vs)]
    return as_svg({
        "title": title,
        "data": {"values": values},
        "mark": {"type": "line", "interpolate": "step-after", "point": True, "tooltip": True},
        "encoding": {
            "x": {"field": "step", "type": "quantitative", "title": x_title, "axis": {"format": "d", "tickMinStep": 1},
                  "scale": {"domain": [0, max((len(vs) for vs in series.values()), default=1) - 1], "nice": False}},
            "y": {"field": "value", "type": "quantitative", "title": y_title,
                  **({"axis": {"format": "d", "tickMinStep": 1}} if counts else {})},
            "color": {"field": "side", "type": "nominal", "title": None,
                      "scale": {"domain": list(series), "range": list(SIDE_COLORS[:len(series)])},
                      "legend": {"labelLimit": 0, "symbolType": "stroke"}},
            "strokeDash": {"field": "side", "type": "nominal", "legend": None,
                           "scale": {"domain": list(series), "range": [[1, 0], [6, 4]][:len(series)]}},
            "strokeWidth": {"field": "side", "type": "nominal", "legend": None,
                            "scale": {"domain": list(series), "range": [5, 2][:len(series)]}},
        },
    })


def cumulative(counts: list[int]) -> list[int]:
    """Running totals of a per-step count (e.g. preemptions): step i holds the sum of steps 0..i."""
    out, total = [], 0
    for c in counts:
        total += c
        out.append(total)
    return out
