"""The Live engine page's beside view: a student's lab parts step beside the engine's own.

With a lab implementation chosen in the sidebar (``sidebar.lab_choice``), a second engine with the
page's settings and requests runs the student's parts in a process of its own
(``lessons.beside.BesideEngine``); each Step steps both. The panel names the first step, field and event
where the two differ (``lessons.compare.first_divergence``, as the *Your parts* page does), draws both
block tables and pools at that step with the first wrong block outlined, or shows the student's
exception with its lab, file and line; the page's own engine keeps running.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from app_pages.labs_page import show_divergence
from app_pages.state import torch_threads
from lessons.beside import BesideEngine, report_record, wrong_blocks
from lessons.compare import first_divergence
from visualize.i18n import t


def chosen() -> str | None:
    """The implementation to step beside the engine: the sidebar's, but none in chat mode (a chat's later
    turns are the page's engine's own answers)."""
    return None if st.session_state.get("chat") else st.session_state.get("lab_impl")


def ensure(llm, impl: str | None, lang: str) -> None:
    """A student's engine for this page's engine and ``impl`` (started with the engine, before its first
    step; the page forces a fresh engine when ``impl`` changes); closed when there is none to run."""
    ss = st.session_state
    beside = ss.get("beside")
    ss["beside_for"] = impl
    if beside is not None and (llm is None or impl is None or beside.engine_id != id(llm) or beside.impl != impl):
        beside.close()
        ss["beside"] = beside = None
    if beside is not None or llm is None or impl is None or ss.get("reports"):
        return
    with st.spinner(t("beside_starting", lang)):
        beside = BesideEngine(llm.config, ss.get("engine_requests", []), impl, torch_threads())
    beside.engine_id = id(llm)
    ss["beside"], ss["beside_reference"] = beside, []


def step_beside(step):
    """``step()`` (the page's engine's step, returning its report) with the student's engine stepping at
    the same time in its own process; the report's comparison record is kept beside the student's."""
    beside = st.session_state.get("beside")
    if beside is None:
        return step()
    beside.send_step()
    try:
        report = step()
    finally:
        beside.receive()
    st.session_state["beside_reference"].append(report_record(report))
    return report


def view(reports: list, block_size: int, lang: str, block_tables_html, pool_view) -> None:
    """The first difference so far, and both engines' block tables and pools at its step, drawn with the
    Live page's own ``block_tables_html`` and ``pool_view`` (passed in: this module is one the page imports)."""
    if st.session_state.get("lab_impl") and st.session_state.get("chat"):
        st.caption(t("beside_no_chat", lang))
    beside = st.session_state.get("beside")
    if beside is None:
        return
    reference = st.session_state.get("beside_reference", [])
    st.subheader(t("beside_title", lang, impl=Path(beside.impl).name))
    if not reference and beside.error is None:
        st.caption(t("beside_ready", lang))
        return
    found = first_divergence({"steps": reference, "error": None}, {"steps": beside.records, "error": beside.error})
    show_divergence(found, len(reference), lang)
    if found is None or found["field"] == "error":
        return
    step = found["step"]
    mine = beside.reports[step] if step < len(beside.reports) else None
    ours = next((r for r in reports if r.step == step), None)
    if mine is None or ours is None:
        return
    blocks = wrong_blocks(found, block_size)
    if blocks:
        st.markdown(f'<div data-testid="beside-wrong-block">{t("beside_wrong_block", lang, step=step, blocks=", ".join(map(str, blocks)))}</div>',
                    unsafe_allow_html=True)
    left, right = st.columns(2)
    for column, report, title, side in ((left, ours, t("labs_engine", lang), "engine"), (right, mine, t("labs_yours", lang), "yours")):
        with column:
            st.markdown(f"#### {title} · {t('step_summary', lang, step=step)}")
            block_tables_html(report, block_size, lang, download=False)
            pool_view(report, block_size, lang, outline=blocks, download=False, key=f"beside_pool_{side}")
