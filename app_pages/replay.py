"""Stepping back: any kept step of the run (the live engine's, or a run opened from a file) on screen.

The step reports are plain data, so the pool map, block tables, memory chart and event log of an
earlier step are drawn from its report; the request texts at that step are rebuilt from the tokens
and text each report added. Step always continues from the newest step.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from visualize.i18n import finish_reason_text, t


@dataclass(frozen=True)
class RequestView:
    """A request as it stood after one step: its text so far, tokens, status and preemptions."""

    request_id: int
    prompt: str
    text: str
    num_tokens: int
    status: str  # "waiting", "running", "preempted", "swapped" (its KV in the CPU pool) or "finished"
    finish_reason: str | None
    num_preemptions: int


def request_views(prompts: dict[int, str], reports: list, upto: int) -> list[RequestView]:
    """Every request after ``reports[upto]``, from the reports up to it (``prompts``: id -> prompt text)."""
    text = {rid: "" for rid in prompts}
    tokens, preemptions, reasons = dict.fromkeys(prompts, 0), dict.fromkeys(prompts, 0), {}
    for report in reports[: upto + 1]:
        for rid, ids in report.new_token_ids.items():
            tokens[rid] = tokens.get(rid, 0) + len(ids)
        for rid, piece in report.new_text.items():
            text[rid] = text.get(rid, "") + piece
        for rid in report.preempted:
            preemptions[rid] = preemptions.get(rid, 0) + 1
        reasons.update(report.finished)
    last = reports[upto]
    running = {s.request_id for s in last.block_tables}
    swapped = set(getattr(last, "swapped", []))  # runs saved before swap existed have none
    views = []
    for rid in sorted(prompts):
        if rid in reasons:
            status = "finished"
        elif rid in running:
            status = "running"
        elif rid in swapped:
            status = "swapped"
        elif rid in last.preempted:
            status = "preempted"
        else:
            status = "waiting"
        views.append(RequestView(rid, prompts[rid], text[rid], tokens[rid], status, reasons.get(rid), preemptions[rid]))
    return views


def status_text(view: RequestView, lang: str) -> str:
    if view.status == "finished":
        return t("status_finished", lang, reason=finish_reason_text(view.finish_reason, lang))
    return t(f"status_{view.status}", lang)


def replay_index(reports: list, lang: str) -> int:
    """A slider over the kept steps (when there are two or more); the index of the report to show.

    It follows the newest step until moved; moved back, it stays on that step while nothing new
    is stepped, and Step (which calls :func:`follow_newest`) brings it back to the newest.
    """
    last = len(reports) - 1
    state = st.session_state
    at = state.get("replay_at")
    if at is None or at > last:
        at = last
    if last < 1:
        return last
    first_step = reports[0].step
    state["replay_slider"] = reports[at].step

    def moved() -> None:
        chosen = state["replay_slider"] - first_step
        state["replay_at"] = None if chosen >= last else chosen

    st.slider(t("replay_step", lang), first_step, reports[-1].step, key="replay_slider", on_change=moved,
              help=t("replay_help", lang))
    if at < last:
        st.info(t("replaying", lang, step=reports[at].step, newest=reports[-1].step))
    return at


def follow_newest() -> None:
    st.session_state["replay_at"] = None
