"""The per-request timeline drawn: one row per request, time (or steps) across, and its latencies.

``timeline_frame`` turns :func:`engine.timeline.build_timeline`'s rows into a tidy table (one row per
request per step, with the hover's text in the reader's language); ``timeline_chart`` draws it with
Altair; ``latency_rows`` and ``bench_serve_summary`` give the latencies per request and as
``python -m engine bench-serve`` prints them (its own ``calculate_metrics``).
"""

from __future__ import annotations

import altair as alt
import pandas as pd

from engine.report import PREEMPTED_BY_RECOMPUTE, PREEMPTED_BY_SWAP, RECOMPUTE_CPU_POOL_FULL, RECOMPUTE_PARTIAL_PREFILL, WAIT_BUDGET
from engine.timeline import DECODE, KV_TRANSFER, PREEMPTED, PREFILL, STALLED, STATES, SWAPPED, WAITING, RequestTimeline, Span
from visualize.i18n import t
from visualize.style import as_svg

STATE_COLORS = {WAITING: "#d9d9d9", PREFILL: "#ff7f0e", DECODE: "#1f77b4", PREEMPTED: "#d62728", SWAPPED: "#9467bd",
                STALLED: "#f2e394", KV_TRANSFER: "#17becf"}
MARKS = (("arrival", "triangle-right", "#000000"), ("first_token", "diamond", "#2ca02c"), ("finished", "square", "#000000"))
PREEMPT_KEYS = {PREEMPTED_BY_RECOMPUTE: "ev_preempt_detail", PREEMPTED_BY_SWAP: "ev_preempt_swap_detail",
                RECOMPUTE_CPU_POOL_FULL: "ev_preempt_cpu_full", RECOMPUTE_PARTIAL_PREFILL: "ev_preempt_partial_prefill"}
ROW_PX = 24  # height of one request's row
MAX_BARS = 3000  # more spans than this are drawn coalesced (``coalesce``): an SVG of many thousand bars is slow to draw
CHART_EXTRA_PX = 130  # the x axis, its title and the legend below the rows
LONG_PREFILL_SHARE = 0.5  # a prefill is "long" when it takes at least this share of its step's tokens


def request_label(request_id: int, lang: str) -> str:
    return t("timeline_request", lang, id=request_id)


def span_texts(span: Span, lang: str) -> tuple[str, str]:
    """(what the request did in the step, why it waited or was slowed: "" when nothing held it up)."""
    what, why = "", ""
    other = span.largest_prefill is not None and span.largest_prefill != span.request_id
    long = other and span.largest_prefill_tokens >= LONG_PREFILL_SHARE * max(span.step_tokens, 1)
    behind = dict(rid=span.largest_prefill, n=span.largest_prefill_tokens, total=span.step_tokens)
    if span.state == WAITING:
        if span.reason == WAIT_BUDGET and long:
            why = t("why_budget_long", lang, **behind)
        elif span.reason:
            why = t(f"why_{span.reason}", lang, rid=span.blocker, hit=span.blocker_cached)
        else:
            why = t("why_unknown", lang)
    elif span.state == PREFILL:
        whole = span.num_tokens == span.prompt_tokens
        what = (t("what_prefill_whole", lang, n=span.num_tokens) if whole else
                t("what_prefill_chunk", lang, n=span.num_tokens, computed=span.computed, total=span.prompt_tokens))
        why = t("why_shares_long_prefill", lang, **behind) if long else ""
    elif span.state == DECODE:
        what = t("what_decode", lang, n=span.new_tokens)
        if span.rejected:
            what += t("sep_list", lang) + t("what_rejected", lang, n=span.rejected)
        why = t("why_shares_long_prefill", lang, **behind) if long else ""
    elif span.state == PREEMPTED:
        what = t(PREEMPT_KEYS[span.reason], lang) if span.reason in PREEMPT_KEYS else span.reason
    elif span.state == SWAPPED:
        what = t("what_swapped", lang)
    elif span.state == STALLED:
        why = t("why_stalled", lang)
    return what, why


def timeline_frame(timelines: list[RequestTimeline], lang: str = "en", unit: str = "ms") -> pd.DataFrame:
    """One row per request per step: request (its label), state (its label), start and end on the
    x axis (ms on the engine's clock, or the step and the next with ``unit="step"``), and the hover's
    step, time, batch, what and why."""
    if unit not in ("ms", "step"):
        raise ValueError(f"unit must be 'ms' or 'step', got {unit!r}")
    rows = []
    for row in timelines:
        for span in row.spans:
            what, why = span_texts(span, lang)
            start, end = (span.start_ms, span.end_ms) if unit == "ms" else (span.step, span.step + 1)
            rows.append(dict(request_id=row.request_id, request=request_label(row.request_id, lang), state=span.state,
                             state_label=t(f"state_{span.state}", lang), start=start, end=end, step=str(span.step),
                             time=f"{span.start_ms:.0f}–{span.end_ms:.0f}",
                             batch=t("timeline_batch_value", lang, n=span.batch_size, tokens=span.step_tokens),
                             what=what, why=why))
    columns = ["request_id", "request", "state", "state_label", "start", "end", "step", "time", "batch", "what", "why"]
    return pd.DataFrame(rows, columns=columns)


def coalesce(frame: pd.DataFrame) -> pd.DataFrame:
    """Consecutive rows of one request with the same state, what and why merged into one bar
    (its ``step`` and ``time`` then ranges, its ``batch`` the first step's): a long run draws
    far fewer marks. Rows are in request order, then step order (as :func:`timeline_frame` makes them)."""
    if frame.empty:
        return frame
    key = frame[["request_id", "state", "what", "why"]].astype(str).agg("|".join, axis=1)
    run = (key != key.shift()).cumsum()
    merged = frame.groupby(run, sort=False).agg(
        request_id=("request_id", "first"), request=("request", "first"), state=("state", "first"),
        state_label=("state_label", "first"), start=("start", "first"), end=("end", "last"), first_step=("step", "first"),
        last_step=("step", "last"), first_time=("time", "first"), last_time=("time", "last"), batch=("batch", "first"),
        what=("what", "first"), why=("why", "first"))
    single = merged["first_step"] == merged["last_step"]
    merged["step"] = merged["first_step"].where(single, merged["first_step"] + "–" + merged["last_step"])
    merged["time"] = merged["first_time"].where(single, merged["first_time"].str.split("–").str[0] + "–"
                                                 + merged["last_time"].str.split("–").str[1])
    return merged[list(frame.columns)].reset_index(drop=True)


def marks_frame(timelines: list[RequestTimeline], lang: str = "en", unit: str = "ms") -> pd.DataFrame:
    """The marks: each request's arrival, first token and end (where known), and the steps in which
    speculative decoding gave draft tokens back (``mark`` "rejected")."""
    rows = []
    for row in timelines:
        at = {"arrival": (row.arrival_ms, row.arrival_step), "first_token": (row.first_token_ms, row.first_token_step),
              "finished": (row.end_ms, row.end_step)}
        for mark, (ms, step) in at.items():
            if ms is None:
                continue
            x = ms if unit == "ms" else (step if mark == "arrival" else step + 1)
            rows.append(dict(request=request_label(row.request_id, lang), mark=mark, label=t(f"mark_{mark}", lang), x=x,
                             text=f"{ms:.0f} ms"))
        for span in row.spans:
            if span.rejected:
                x = (span.start_ms + span.end_ms) / 2 if unit == "ms" else span.step + 0.5
                rows.append(dict(request=request_label(row.request_id, lang), mark="rejected", x=x,
                                 label=t("what_rejected", lang, n=span.rejected), text=t("step_summary", lang, step=span.step)))
    return pd.DataFrame(rows, columns=["request", "mark", "label", "x", "text"])


def timeline_chart(timelines: list[RequestTimeline], lang: str = "en", unit: str = "ms", width: int | str = "container") -> alt.LayerChart:
    """The timeline (Altair, drawn as SVG): a bar per request per step coloured by its state (beyond
    MAX_BARS steps' bars, one per stretch of equal steps: :func:`coalesce`), the marks on top; hover
    a bar for its step, batch, what and why."""
    frame, marks = timeline_frame(timelines, lang, unit), marks_frame(timelines, lang, unit)
    if len(frame) > MAX_BARS:  # a long run: one bar per stretch of equal steps, not per step
        frame = coalesce(frame)
    order = [request_label(r.request_id, lang) for r in timelines]
    y = alt.Y("request:N", sort=order, title=None, axis=alt.Axis(labelLimit=0, labelOverlap=False))
    x_title = t("timeline_unit_ms", lang) if unit == "ms" else t("step_axis", lang)
    color = alt.Color("state_label:N", title=None, legend=alt.Legend(orient="bottom", labelLimit=0, columns=6),
                      scale=alt.Scale(domain=[t(f"state_{s}", lang) for s in STATES], range=[STATE_COLORS[s] for s in STATES]))
    tooltip = [alt.Tooltip("request:N", title=t("request", lang)), alt.Tooltip("state_label:N", title=t("timeline_state", lang)),
               alt.Tooltip("step:N", title=t("step_axis", lang)), alt.Tooltip("time:N", title=t("timeline_time", lang)),
               alt.Tooltip("batch:N", title=t("timeline_batch", lang)), alt.Tooltip("what:N", title=t("timeline_what", lang)),
               alt.Tooltip("why:N", title=t("timeline_why", lang))]
    bars = alt.Chart(frame).mark_bar(stroke="#ffffff", strokeWidth=0.5).encode(
        x=alt.X("start:Q", title=x_title, axis=alt.Axis(format="d", tickMinStep=1) if unit == "step" else alt.Axis()),
        x2="end:Q", y=y, color=color, tooltip=tooltip)
    layers = [bars]
    for mark, shape, fill in MARKS + (("rejected", "cross", "#b71c1c"),):
        points = marks[marks["mark"] == mark]
        if len(points):
            layers.append(alt.Chart(points).mark_point(shape=shape, filled=True, size=70, color=fill, opacity=1).encode(
                x="x:Q", y=y, tooltip=[alt.Tooltip("request:N", title=t("request", lang)), alt.Tooltip("label:N", title=t("timeline_state", lang)),
                                      alt.Tooltip("text:N", title=t("timeline_time", lang))]))
    return as_svg(alt.layer(*layers).properties(height=ROW_PX * max(len(order), 1), width=width))


def latency_rows(timelines: list[RequestTimeline]) -> list[dict]:
    """Per request: request_id, arrival_ms, ttft_ms, ttft_steps, tpot_ms, itl_max_ms (its longest gap
    between two tokens: a decode stall), e2el_ms, output_tokens (None where not known yet), as the page's
    latency table shows them."""
    return [dict(request_id=r.request_id, arrival_ms=r.arrival_ms, ttft_ms=r.ttft_ms, ttft_steps=r.ttft_steps, tpot_ms=r.tpot_ms,
                 itl_max_ms=max(r.itl_ms) if r.itl_ms else None, e2el_ms=r.e2el_ms, output_tokens=r.output_tokens)
            for r in timelines]


def bench_serve_summary(timelines: list[RequestTimeline]) -> dict | None:
    """Mean, median and P99 of TTFT, TPOT, ITL and E2EL (ms) over the finished requests, computed by
    ``bench-serve``'s own ``calculate_metrics`` (keys ``mean_ttft_ms``, ...); None when none finished."""
    from engine.tools.bench_serve import METRICS, RequestResult, calculate_metrics

    done = [r for r in timelines if r.end_ms is not None and r.first_token_ms is not None]
    if not done:
        return None
    results = [RequestResult(success=True, output_tokens=r.output_tokens, ttft=r.ttft_ms / 1e3, latency=r.e2el_ms / 1e3,
                             itl=[gap / 1e3 for gap in r.itl_ms], start_time=r.arrival_ms / 1e3) for r in done]
    duration = max(max(r.end_ms for r in done) - min(r.arrival_ms for r in done), 1e-9) / 1e3
    return calculate_metrics(results, duration, [99], list(METRICS))
