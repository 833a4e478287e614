"""Two runs of the same workload, step by step: the lab's engine beside real vLLM (engine/replay.py's series)."""

from __future__ import annotations

SIDE_COLORS = ("#1f77b4", "#ff7f0e")  # the lab's engine, vLLM


def step_series_spec(series: dict[str, list[float]], title: str, y_title: str, x_title: str, height: int = 200) -> dict:
    """A Vega-Lite spec of one per-step measure of each run: a step line per label (first the lab's,
    then vLLM's). Step i is the i-th step that ran (1-based); the data travel inline in
    ``data.values`` as {"step", "value", "side"}."""
    values = [{"step": i + 1, "value": v, "side": label} for label, vs in series.items() for i, v in enumerate(vs)]
    return {
        "title": title,
        "height": height,
        "data": {"values": values},
        "mark": {"type": "line", "interpolate": "step-after", "point": True, "tooltip": True},
        "encoding": {
            "x": {"field": "step", "type": "quantitative", "title": x_title, "axis": {"format": "d", "tickMinStep": 1}},
            "y": {"field": "value", "type": "quantitative", "title": y_title},
            "color": {"field": "side", "type": "nominal", "title": None,
                      "scale": {"domain": list(series), "range": list(SIDE_COLORS[:len(series)])},
                      "legend": {"orient": "bottom", "labelLimit": 0}},
            "strokeDash": {"field": "side", "type": "nominal", "legend": None},  # equal runs: both lines still visible
        },
    }
