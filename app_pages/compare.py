"""Paged vs contiguous: one workload through both allocators, side by side.

Small workloads run the real engine (the sidebar's model and workload); large ones run the
model-free simulator (engine/sim/simulator.py: the same scheduler and allocators on lengths only),
with the paper's Figure 12 below (latency against request rate, engine/experiments/figures.py on a
small workload). A third source sets a recorded real-vLLM replay beside the lab's engine
(app_pages/beside_vllm.py).
"""

from __future__ import annotations

import math
import pandas as pd
import streamlit as st

from app_pages import timeline_panel
from app_pages.common import category_help, plain, png_download, progress_bar, workload_rows
from app_pages.state import add_workload, build_engine, run_to_end
from app_pages.widgets import localized_choice
from engine.core.accounting import CATEGORIES
from engine.experiments.paper_data import PAPER_TOKEN_STATES
from visualize.i18n import error_text, t
from visualize.memory import memory_chart, memory_figure, memory_frame, series_figure, series_spec, simulation_memory_frame
from visualize.paper import (PAPER_SYSTEM_OF, figure_texts, latency_rate_spec, paper_system_label, plot_memory_breakdown,
                             share_metrics)
from visualize.pool import pool_map_spec

MAX_SIM_REQUESTS = 5000
SWEEP_REQUESTS = 500  # per point of the latency chart: small, so the page stays responsive (cached)


def _label(allocator: str, reservation: str) -> str:
    """The system's key (visualize.paper.PAPER_SYSTEM_OF): "paged" or "contiguous (<reservation>)"."""
    return "paged" if allocator == "paged" else f"contiguous ({reservation})"


def side_settings(allocator: str, reservation: str) -> dict:
    """The engine overrides of one side. The contiguous allocator gives each request its own range,
    so it has no blocks to share or swap: it runs without prefix caching and preempts by recompute
    (EngineConfig refuses both with it), whatever the sidebar chose for the paged side."""
    overrides = dict(allocator=allocator, reservation=reservation)
    if allocator == "contiguous":
        overrides.update(enable_prefix_caching=False, preemption_mode="recompute")
    return overrides


def system_label(key: str, lang: str) -> str:
    """A system key in the reader's language."""
    if key == "paged":
        return t("system_paged", lang)
    return t("system_contiguous", lang, reservation=key.split("(")[1].rstrip(")"))


def page() -> None:
    lang = st.session_state["lang"]
    st.title(t("page_compare", lang))
    st.caption(t("compare_intro", lang))
    source = localized_choice(st.radio, t("source", lang), ("engine", "sim"), "compare_source", lang,
                              lambda s: t(f"source_{s}", lang), horizontal=True)
    if source == "engine":
        engine_comparison(lang)
    else:
        simulator_comparison(lang)
    st.caption(t("compare_vllm_moved", lang))


# ---- the real engine -----------------------------------------------------------------------


def engine_comparison(lang: str) -> None:
    settings = st.session_state["settings"]
    reservation = settings.reservation
    c = st.columns([1, 1, 2])
    reservation = c[0].selectbox(t("reservation", lang), ("max", "pow2", "oracle"), key="compare_reservation",
                                 index=("max", "pow2", "oracle").index(reservation), help=t("reservation_help", lang))
    limit = int(c[1].number_input(t("max_steps", lang), 10, 1000, 300, key="compare_limit"))
    if settings.enable_prefix_caching is not False or settings.preemption_mode == "swap":
        st.caption(t("compare_contiguous_plain", lang))
    rule = "chunked" if settings.enable_chunked_prefill else {"decodes": "whole"}.get(getattr(settings, "schedule_first", "decodes"), "prefills")
    st.caption(t("sched_rule_run", lang, rule=t(f"sched_rule_{rule}", lang)), help=t("sched_rule_help", lang))
    if c[2].button(t("run_compare", lang), type="primary", key="btn_compare"):
        runs = {}
        for allocator in ("paged", "contiguous"):
            label = _label(allocator, reservation)
            bar, progress = progress_bar(lang, settings.model)
            try:
                llm = build_engine(settings, progress, **side_settings(allocator, reservation))
            except Exception as error:
                st.error(t("error_engine", lang, error=plain(error_text(error, lang))))
                return
            finally:
                bar.empty()
            for row, error in add_workload(llm, workload_rows(), settings.temperature, settings.seed):
                st.warning(t("error_request", lang, row=row, error=plain(error_text(error, lang))))
            status = st.progress(0.0, text=t("running_compare", lang, allocator=label))
            runs[label] = run_to_end(llm, limit, lambda n: status.progress(min(n / limit, 1.0), text=t("running_compare", lang, allocator=label)))
            status.empty()
        st.session_state["compare_runs"] = (runs, settings.block_size)
    stored = st.session_state.get("compare_runs")
    if not stored:
        st.info(t("compare_hint", lang))
        return
    runs, block_size = stored
    show_engine_runs(runs, block_size, lang)


def show_engine_runs(runs: dict, block_size: int, lang: str) -> None:
    longest = max(len(r) for r in runs.values())
    step = st.slider(t("replay_step", lang), 0, max(longest - 1, 1), 0, key="compare_step") if longest > 1 else 0
    cols = st.columns(len(runs))
    for col, (label, reports) in zip(cols, runs.items()):
        with col:
            st.markdown(f"### {system_label(label, lang)}")
            report = reports[min(step, len(reports) - 1)]
            st.vega_lite_chart(pool_map_spec(report, block_size, lang), width="stretch")
            generated = sum(len(ids) for r in reports for ids in r.new_token_ids.values())
            seconds = sum(r.timings_ms.get("total", 0) for r in reports) / 1e3
            running = [len(r.scheduled) for r in reports]
            m = st.columns(3)
            m[0].metric(t("steps_taken", lang), len(reports))
            m[1].metric(t("mean_running", lang), f"{sum(running) / len(running):.1f}")
            m[2].metric(t("throughput", lang) + " (tok/s)", f"{generated / max(seconds, 1e-9):.1f}")
            st.altair_chart(memory_chart(memory_frame(reports), "tokens", lang, height=180, legend_columns=2), width="stretch", height=280)
    series = {system_label(label, lang): ([r.step for r in reports], [len(r.scheduled) for r in reports]) for label, reports in runs.items()}
    st.markdown(f"**{t('concurrency', lang)}**")
    st.vega_lite_chart(series_spec(series, t("concurrency_axis", lang), lang), width="stretch", height=260)
    png_download(t("save_png", lang), lambda: series_figure(series, t("concurrency", lang), lang), "concurrency.png", "png_conc")
    rows = [_paper_row(t("fig2_workload_engine", lang), label, memory_frame(reports)) for label, reports in runs.items()]
    paper_bars(rows, lang)
    for index, (label, reports) in enumerate(runs.items()):
        st.markdown(f"#### {t('timeline_title', lang)}{'：' if lang == 'zh' else ': '}{system_label(label, lang)}")
        timeline_panel.timeline_view(reports, lang, key=f"compare_timeline_{index}")


def _paper_row(workload: str, system: str, frame: pd.DataFrame, weights=None) -> dict:
    """A ``reproduce_paper``-style row (time-averaged shares) for visualize/paper.py."""
    weights = pd.Series(1.0, index=frame.index) if weights is None else pd.Series(weights, index=frame.index)
    totals = {c: float((frame[c] * weights).sum()) for c in CATEGORIES}
    capacity = sum(totals.values()) or 1.0
    shares = {c: v / capacity for c, v in totals.items()}
    return dict(workload=workload, system=system, fragmentation=shares, token_state_fraction=shares["token_states"])


def paper_bars(rows: list[dict], lang: str) -> None:
    """Figure 2 bars of the rows (system keys), with the paper's token-state share marked and a caption."""
    st.markdown(f"**{t('paper_bars', lang)}**")
    rows = [dict(r, system=system_label(r["system"], lang),
                 paper_token_state_fraction=PAPER_TOKEN_STATES.get(PAPER_SYSTEM_OF.get(r["system"]))) for r in rows]
    fig = plot_memory_breakdown(rows, lang=lang)
    st.session_state["paper_figure_texts"] = figure_texts(fig)  # what the reader sees, for the tests
    st.pyplot(fig, clear_figure=True)
    st.caption(t("fig2_caption", lang))
    category_help(lang)


# ---- the simulator -------------------------------------------------------------------------


@st.cache_data(show_spinner=False, max_entries=16)
def _simulate(workload: str, num_requests: int, kv_slots: int, block_size: int, allocator: str, reservation: str, seed: int,
              rule: str = "paper"):
    from engine.experiments.paper_data import SCHEDULER_RULES
    from engine.sim.simulator import simulate

    # Contiguous = the paper's Orca, which places ranges in buddy chunks (as reproduce-paper's PAPER_SYSTEMS).
    placement = "buddy" if allocator == "contiguous" else "first-fit"
    return simulate(workload=workload, num_requests=num_requests, kv_slots=kv_slots, block_size=block_size,
                    allocator=allocator, reservation=reservation, placement=placement, seed=seed, **SCHEDULER_RULES[rule])


def simulator_comparison(lang: str) -> None:
    from engine.experiments.paper_data import SCHEDULER_RULES

    settings = st.session_state["settings"]
    c = st.columns(4)
    workload = c[0].selectbox(t("sim_workload", lang), ("sharegpt", "alpaca"), key="sim_workload")
    num_requests = int(c[1].number_input(t("num_requests", lang), 10, MAX_SIM_REQUESTS, 500, step=100, key="sim_requests"))
    kv_slots = int(c[2].number_input(t("kv_slots", lang), 2048, 200_000, 15_700, step=1000, key="sim_slots"))
    reservation = c[3].selectbox(t("reservation", lang), ("max", "pow2", "oracle"), key="sim_reservation")
    # A row of its own: its choices are whole phrases ("decodes first, 2,560-token budget (the paper's, vLLM 0.1)").
    rule = localized_choice(st.selectbox, t("sched_rule", lang), tuple(SCHEDULER_RULES), "sim_rule", lang,
                            lambda k: t(f"sched_rule_{k}", lang), help=t("sched_rule_help", lang))
    st.caption(t("sched_rule_run", lang, rule=t(f"sched_rule_{rule}", lang)))
    results = {}
    try:
        for allocator in ("paged", "contiguous"):
            results[_label(allocator, reservation)] = _simulate(workload, num_requests, kv_slots, settings.block_size,
                                                                 allocator, reservation, settings.seed, rule)
    except ValueError as error:
        st.error(t("error_simulation", lang, error=plain(error_text(error, lang))))
        return
    cols = st.columns(len(results))
    for col, (label, res) in zip(cols, results.items()):
        with col:
            st.markdown(f"### {system_label(label, lang)}")
            shares = share_metrics(res.fragmentation, lang)
            m = st.columns(2) + st.columns(3)  # the shares two to a row: their labels stay whole in 中文 too
            for box, (label_text, value) in zip(m, shares):
                box.metric(label_text, value, help=t("token_share_help", lang))
            m[3].metric(t("mean_running", lang), f"{res.mean_concurrent_requests:.1f}")
            m[4].metric(t("preemptions_run", lang), res.preemptions)
            frame = simulation_memory_frame(res)
            st.altair_chart(memory_chart(frame, "tokens", lang, height=180, legend_columns=2), width="stretch", height=280)
            png_download(t("save_png", lang), lambda f=frame, l=system_label(label, lang): memory_figure(f, "tokens", lang, title=l),
                         f"sim_memory_{label}.png", f"png_sim_{label}")
    series = {system_label(label, lang): (res.series_step, res.series_running) for label, res in results.items()}
    st.markdown(f"**{t('concurrency', lang)}**")
    st.vega_lite_chart(series_spec(series, t("concurrency_axis", lang), lang), width="stretch", height=260)
    rows = [dict(workload=workload, system=label, fragmentation=res.fragmentation, token_state_fraction=res.token_state_fraction)
            for label, res in results.items()]
    paper_bars(rows, lang)
    head_of_line_timelines(lang)
    latency_against_rate(workload, settings.seed, lang)


LONG_ARRIVAL_S = 0.15  # the long prompt arrives while the eight short requests decode (their 32 tokens take ~0.6 s)


@st.cache_data(show_spinner=False, max_entries=2)
def _head_of_line_steps(chunked: bool) -> list:
    from engine.sim.simulator import simulate
    from engine.sim.workloads import head_of_line_workload

    return simulate(requests=head_of_line_workload(long_arrival_s=LONG_ARRIVAL_S), kv_slots=15_700, cost_model="a100-opt-13b",
                    record_steps=True, enable_chunked_prefill=chunked, max_num_batched_tokens=512 if chunked else None).step_reports


def head_of_line_timelines(lang: str) -> None:
    """The simulator's decode-stall demo (eight short requests decoding when a long prompt arrives) on its
    A100 clock, with whole prompts and with chunked prefill, each as a per-request timeline, and what the
    two runs show, measured on them (:func:`decode_stall_numbers`)."""
    st.markdown(f"**{t('sim_timeline_title', lang)}**")
    st.caption(t("sim_timeline_caption", lang, arrival=f"{LONG_ARRIVAL_S * 1000:.0f}"))
    runs = {chunked: _head_of_line_steps(chunked) for chunked in (False, True)}
    for chunked, reports in runs.items():
        st.markdown(t("sim_timeline_chunked" if chunked else "sim_timeline_whole", lang))
        timeline_panel.timeline_view(reports, lang, key=f"sim_timeline_{int(chunked)}")
    st.caption(t("sim_timeline_conclusion", lang, **decode_stall_numbers(runs[False], runs[True])))


def decode_stall_numbers(whole: list, chunked: list) -> dict:
    """The decode-stall demo's result, from its two runs' step reports: the short requests' longest gap
    between two tokens (ITL, ms) with whole prompts and with chunked prefill, and the long prompt's TTFT
    (ms) in each (the long prompt is the last request)."""
    from engine.timeline import build_timeline

    rows = {name: build_timeline(reports) for name, reports in (("whole", whole), ("chunked", chunked))}
    stall = {name: max(max(r.itl_ms) for r in rs[:-1] if r.itl_ms) for name, rs in rows.items()}
    ttft = {name: rs[-1].ttft_ms for name, rs in rows.items()}
    return dict(itl_whole=f"{stall['whole']:.0f}", itl_chunked=f"{stall['chunked']:.0f}", ttft_whole=f"{ttft['whole']:.0f}",
                ttft_chunked=f"{ttft['chunked']:.0f}")


@st.cache_data(show_spinner=False, max_entries=8)
def _latency_sweep(workload: str, num_requests: int, seed: int, setup: str, calibrated_at: int) -> list[dict]:
    """The sweep, cached; ``calibrated_at`` (this machine's calibration file's mtime, ns) is only part of
    the cache key, so a new ``python -m engine calibrate`` is not answered with the old fit's sweep."""
    from engine.experiments.figures import latency_sweep

    # The preset's own pool and longest request (kv_slots/max_model_len None), at rates that suit it.
    return latency_sweep((workload,), num_requests=num_requests, seed=seed, setup=setup, kv_slots=None, max_model_len=None)


def latency_presets() -> tuple[str, ...]:
    """The step-time presets offered: the GPU ones, and this machine's once it is calibrated."""
    from engine.sim.cost_model import SETUPS, THIS_MACHINE, calibration_path

    return tuple(s for s in SETUPS if s != THIS_MACHINE or calibration_path().exists())


def _preset_text(key: str, lang: str) -> str:
    from engine.sim.cost_model import get_setup

    return t(f"preset_{key}", lang, slots=f"{get_setup(key).kv_slots:,}")


def latency_against_rate(workload: str, seed: int, lang: str) -> None:
    """The paper's Figure 12 for the chosen workload and step-time preset: normalized latency against
    request rate per system, the paper's ratios drawn beside it, and a table of the rates."""
    from engine.sim.cost_model import THIS_MACHINE, calibration_path, get_setup
    from engine.experiments.figures import (FIGURE_12_SYSTEMS, SETUP, THRESHOLD, paper_rate_marks, rate_table,
                                          steady_requests, sweep_rates, vllm_capacity)

    st.subheader(t("latency_rate_header", lang))
    presets = latency_presets()
    c = st.columns([3, 1])
    setup = localized_choice(c[0].selectbox, t("latency_preset", lang), presets, "latency_setup", lang,
                             lambda k: _preset_text(k, lang), default=SETUP)
    if THIS_MACHINE not in presets:
        c[0].caption(t("preset_no_calibration", lang))
    preset = get_setup(setup)
    key = f"latency_requests_{setup}_{workload}"  # each preset and workload keeps its own count
    st.session_state.setdefault(key, steady_requests(workload, setup, SWEEP_REQUESTS))
    num_requests = int(c[1].number_input(t("latency_requests", lang), 50, 5000, step=50, key=key))
    st.caption(t("latency_rate_intro", lang, n=num_requests, slots=f"{preset.kv_slots:,}", max_len=f"{preset.max_model_len:,}"))
    rates, low = sweep_rates(workload, setup)
    if setup == SETUP:
        st.caption(t("latency_rates_paper", lang))
    else:
        mine, paper = vllm_capacity(workload, setup), vllm_capacity(workload, SETUP)
        st.caption(t("latency_rates_scaled", lang, scale=f"{mine.rate / paper.rate:.3g}", capacity=f"{mine.rate:.3g}",
                     batch=mine.batch, paper_capacity=f"{paper.rate:.3g}"))
        st.caption(t("latency_requests_note", lang, batch=mine.batch, n=steady_requests(workload, setup, SWEEP_REQUESTS)))
    with st.spinner(t("simulating_sweep", lang, runs=len(rates) * len(FIGURE_12_SYSTEMS) + len(low))):
        stamp = calibration_path().stat().st_mtime_ns if setup == THIS_MACHINE else 0
        rows = _latency_sweep(workload, num_requests, seed, setup, stamp)
    table = rate_table(rows)
    vllm = next(r for r in table if r["system"] == "vLLM")
    marks = paper_rate_marks(workload, vllm["rate"])
    st.vega_lite_chart(latency_rate_spec(rows, lang, marks), width="stretch", height=360)
    found = []
    for r in table:
        kind = "sustainable_below" if r["loaded_at_lowest"] else "sustainable_rate" if r["reached"] else "sustainable_at_least"
        rate = t(kind, lang, rate=f"{r['rate']:.2f}")
        found.append(f"{paper_system_label(r['system'], lang)} {rate}")
    st.caption(t("sustainable_line", lang, threshold=f"{THRESHOLD:g}", rates="; ".join(found)))
    rate_summary(table, workload, setup, lang)


def rate_summary(table: list[dict], workload: str, setup: str, lang: str) -> None:
    """Beside the chart: each system's sustainable rate here, vLLM's ratio over it, and the paper's."""
    from engine.experiments.figures import THRESHOLD
    from visualize.paper import paper_ratio_label

    # One format for the column: as many decimals as give the smallest rate two significant digits (at least 2).
    smallest = min((r["rate"] for r in table if r["rate"] > 0), default=1.0)
    decimals = max(2, 1 - math.floor(math.log10(smallest)))

    def here(r) -> str:
        rate = f"{r['rate']:.{decimals}f}"
        if r["loaded_at_lowest"]:  # saturated below the sweep: its rate is under the lowest one
            return f"< {rate}"
        return rate if r["reached"] else f"≥ {rate}"  # never crossed: a lower bound

    def ratio(r) -> str:
        if r["ratio"] is None:
            return "–"
        bound = "> " if r["loaded_at_lowest"] else ("≥ " if not vllm["reached"] else "")
        return f"{bound}{r['ratio']:.2f}×"

    vllm = next(r for r in table if r["system"] == "vLLM")
    st.table(pd.DataFrame({
        t("rate_table_system", lang): [paper_system_label(r["system"], lang) for r in table],
        t("rate_table_rate", lang): [here(r) for r in table],
        t("rate_table_ratio", lang): [ratio(r) for r in table],
        t("paper_ratio_col", lang): [paper_ratio_label(r["paper"], lang, decimals=1) for r in table],
    }))
    if any(r["loaded_at_lowest"] for r in table):
        st.caption(t("rate_table_loaded", lang, threshold=f"{THRESHOLD:g}"))
    if workload != "sharegpt":
        st.caption(t("paper_no_alpaca", lang))
        return
    st.caption(t("paper_marks_caption", lang))
    if not vllm["reached"]:
        st.caption(t("paper_marks_lower_bound", lang))
    if not setup.startswith("a100-opt-13b"):
        st.caption(t("paper_not_setup", lang, preset=_preset_text(setup, lang)))
