"""Your parts: a lab implementation beside the engine's own, step for step (``lessons/compare.py``).

The overview: one fixed workload without a model (six requests with prefix caching, parallel
sampling and preemption), run to the end in a few seconds. The Live engine page steps the same
choice beside its own engine on its own workload and model (``lessons/beside.py``); both report
the first difference with :func:`show_divergence`.

The implementation is chosen in the sidebar (``sidebar.lab_choice``): a starter or find-the-bug file
of ``labs/starters/``, or a student's own file or folder. Both runs happen in processes of their own
(the seam swaps parts when the engine's modules are imported, ``engine/core/lab_impl.py``), so a
student's exception ends that run alone and the app keeps working.
"""

from __future__ import annotations

import streamlit as st

from lessons.compare import first_divergence, run
from visualize.i18n import t


def page() -> None:
    lang = st.session_state.get("lang", "en")
    st.title(t("page_labs", lang))
    st.caption(t("labs_intro", lang) + " " + t("labs_on_live", lang))
    impl = st.session_state.get("lab_impl")
    if not impl:  # the choice is in the sidebar, folded away on a phone
        st.info(t("labs_choose_first", lang))
    if st.button(t("labs_run", lang), type="primary", disabled=not impl):
        with st.spinner(t("labs_running", lang)):
            reference, mine = run("solution"), run(impl)
        st.session_state["labs_result"] = (impl, len(reference["steps"]), first_divergence(reference, mine))
    result = st.session_state.get("labs_result")
    if result is None or result[0] != impl:
        return
    show_divergence(result[2], result[1], lang)


def show_divergence(found: dict | None, steps: int, lang: str) -> None:
    """:func:`lessons.compare.first_divergence`'s answer, as a person reads it: the same at every one of
    ``steps`` steps; the student's exception with its lab, file and line (and the traceback); or the
    first step and what differs, the engine's value beside the student's."""
    if found is None:
        st.success(t("labs_same", lang, steps=steps))
    elif found["field"] == "reference_error":
        st.error(t("labs_reference_error", lang, step=found["step"], exception=found["error"]["exception"]))
    elif found["field"] == "error":
        e = found["error"]
        st.error(t("labs_error", lang, step=e["step"], exception=e["exception"], lab=e["lab"] or "?", file=e["file"] or "?",
                   line=e["line"] or "?"))
        if e["code"]:
            st.code(e["code"], language="python")
        with st.expander(t("labs_traceback", lang)):
            st.code(e["traceback"])
    else:
        events = found["field"] == "events" and found.get("event") is not None
        what = t("labs_what_events", lang, index=found["event"]) if events else t(f"labs_what_{found['field']}", lang)
        st.warning(t("labs_diverged", lang, step=found["step"], what=what))
        left, right = st.columns(2)
        left.markdown(f"**{t('labs_engine', lang)}**")
        left.json(found.get("reference_event") if events else found["reference"])
        right.markdown(f"**{t('labs_yours', lang)}**")
        right.json(found.get("student_event") if events else found["student"])
