"""The per-request timeline on a page: the chart, each request's latencies beside bench-serve's
summary, and the trace download. Built from step reports alone (``engine/timeline.py``) and drawn by
``visualize/timeline.py``; the Live page (a live run, a saved run, a classroom session) and the Paged
vs contiguous page call :func:`timeline_view` with a line each.
"""

from __future__ import annotations

import html

import streamlit as st

from app_pages.widgets import localized_choice
from engine.timeline import build_timeline, chrome_trace_json
from visualize.i18n import t
from visualize.timeline import CHART_EXTRA_PX, bench_serve_summary, latency_rows, request_label, timeline_chart

LATENCY_COLUMNS = (("arrival_ms", "latency_arrival"), ("ttft_ms", "latency_ttft"), ("ttft_steps", "latency_ttft_steps"),
                   ("tpot_ms", "latency_tpot"), ("itl_max_ms", "latency_itl_max"), ("e2el_ms", "latency_e2el"),
                   ("output_tokens", "latency_output_tokens"))


def timeline_view(reports: list, lang: str, key: str = "timeline", labels: dict[int, str] | None = None) -> None:
    """The timeline of ``reports`` (consecutive step reports, oldest first); ``key`` keeps two views
    on one page apart; ``labels``: request id -> its client's name (a classroom's)."""
    timelines = build_timeline(reports)
    st.markdown(f"**{t('timeline_title', lang)}**")
    if not timelines:
        return
    unit = localized_choice(st.radio, t("timeline_unit", lang), ("ms", "step"), f"{key}_unit", lang,
                            lambda u: t(f"timeline_unit_{u}", lang), horizontal=True)
    chart = timeline_chart(timelines, lang, unit)
    st.altair_chart(chart, width="stretch", height=chart.height + CHART_EXTRA_PX)
    st.caption(t("timeline_caption", lang))
    latency_table(timelines, lang, key, labels)
    summary_table(timelines, lang, key)
    st.download_button(t("timeline_download", lang), lambda: chrome_trace_json(reports), file_name="timeline_trace.json",
                       mime="application/json", key=f"{key}_trace", help=t("timeline_download_help", lang))


def _number(value, digits: int = 1) -> str:
    if value is None:
        return "—"
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def latency_table(timelines, lang: str, key: str, labels: dict[int, str] | None = None) -> None:
    """Each request's latencies as an HTML table (its cells carry ``data-metric``, its rows ``data-request``)."""
    st.markdown(f"**{t('latency_title', lang)}**")
    head = "".join(f"<th>{html.escape(t(title, lang))}</th>" for _, title in LATENCY_COLUMNS)
    body = []
    for row in latency_rows(timelines):
        rid = row["request_id"]
        who = request_label(rid, lang) + (f" · {html.escape(labels[rid])}" if labels and rid in labels else "")
        cells = "".join(f'<td data-metric="{name}" style="text-align:right">{_number(row[name])}</td>' for name, _ in LATENCY_COLUMNS)
        body.append(f'<tr data-request="{rid}"><td>{who}</td>{cells}</tr>')
    st.markdown(f'<table data-testid="timeline-latency" data-key="{key}" style="font-size:0.85rem">'
                f'<tr><th>{html.escape(t("request", lang))}</th>{head}</tr>{"".join(body)}</table>', unsafe_allow_html=True)
    st.caption(t("latency_caption", lang))


def summary_table(timelines, lang: str, key: str) -> None:
    """Mean, median and P99 of TTFT, TPOT, ITL and E2EL as ``bench-serve`` computes them."""
    summary = bench_serve_summary(timelines)
    if summary is None:
        return
    st.markdown(f"**{t('latency_summary_title', lang)}**")
    stats = (("mean", "latency_mean"), ("median", "latency_median"), ("p99", "latency_p99"))
    head = "".join(f"<th>{html.escape(t(title, lang))}</th>" for _, title in stats)
    rows = "".join(f'<tr data-metric="{m}"><td>{html.escape(t(f"latency_{m}", lang))}</td>'
                   + "".join(f'<td style="text-align:right">{summary[f"{s}_{m}_ms"]:.1f}</td>' for s, _ in stats) + "</tr>"
                   for m in ("ttft", "tpot", "itl", "e2el"))
    st.markdown(f'<table data-testid="timeline-summary" data-key="{key}" style="font-size:0.85rem">'
                f'<tr><th>{html.escape(t("latency_metric", lang))}</th>{head}</tr>{rows}</table>', unsafe_allow_html=True)
