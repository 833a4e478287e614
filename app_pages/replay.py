"""Stepping back: any kept step of the run (the live engine's, or a run opened from a file) on screen.

The step reports are plain data, so the pool map, block tables, memory chart and event log of an
earlier step are drawn from its report; the request texts at that step are rebuilt from the tokens
and text each report added. Step always continues from the newest step.
"""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from engine.report import PRUNED, SHARING_BEAM, SHARING_NONE, sequence_texts
from visualize.i18n import finish_reason_text, t


@dataclass(frozen=True)
class SequenceView:
    """One sample or beam of a request with several sequences, as it stood after one step.

    Attributes:
        seq_id: the engine's sequence id.
        index: parallel sampling: the sample's index; beam search: the beam's rank after the step
            (0 = best), or its last rank when it was pruned or the search ended.
        text: the text it streamed so far (``engine.report.sequence_texts``).
        state: "live", "pruned" (a beam none of whose candidates survived) or a finish reason.
        cumulative_logprob, score: beam search: its last ``BeamScore``'s (None for samples).
    """

    seq_id: int
    index: int
    text: str
    state: str
    cumulative_logprob: float | None = None
    score: float | None = None


@dataclass(frozen=True)
class RequestView:
    """A request as it stood after one step: its text so far, tokens, status and preemptions; with
    several sequences (``sharing`` "parallel" or "beam"), each sample's or beam's text in ``sequences``
    (samples in index order; beams live ones best first, then the pruned ones)."""

    request_id: int
    prompt: str
    text: str
    num_tokens: int
    status: str  # "waiting", "running", "preempted", "swapped" (its KV in the CPU pool) or "finished"
    finish_reason: str | None
    num_preemptions: int
    sharing: str = SHARING_NONE
    sequences: tuple[SequenceView, ...] = ()


def request_views(prompts: dict[int, str], reports: list, upto: int, final_beams: dict | None = None) -> list[RequestView]:
    """Every request after ``reports[upto]``, from the reports up to it (``prompts``: id -> prompt text).

    ``final_beams``: request id -> the finished beam search's hypotheses, best first (the engine's
    ``RequestOutput.outputs``). The step that ends a search appends each hypothesis's last token without
    streaming it, so once the request has finished these are listed as its beams, not the beams of
    the step before, which lack that token."""
    text = {rid: "" for rid in prompts}
    tokens, preemptions, reasons, sharing = dict.fromkeys(prompts, 0), dict.fromkeys(prompts, 0), {}, {}
    beam_steps = {}  # beam search: steps in which its beams got a token (each live beam gets one)
    for report in reports[: upto + 1]:
        sharing.update(getattr(report, "sharing", {}))  # runs saved before per-sequence text have none
        for rid in getattr(report, "seq_new_text", {}):
            beam_steps[rid] = beam_steps.get(rid, 0) + 1
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
        mode = sharing.get(rid, SHARING_NONE)
        sequences = sequence_views(reports[: upto + 1], rid, mode) if mode != SHARING_NONE else ()
        if mode == SHARING_BEAM and rid in reasons and rid in (final_beams or {}):
            sequences = final_beam_views(final_beams[rid], reasons[rid]) + tuple(s for s in sequences if s.state == PRUNED)
        if mode == SHARING_BEAM and rid not in reasons:
            tokens[rid] = beam_steps.get(rid, 0)  # a beam request streams no text of its own until it ends
        views.append(RequestView(rid, prompts[rid], text[rid], tokens[rid], status, reasons.get(rid), preemptions[rid],
                                 mode, sequences))
    return views


def sequence_views(reports: list, request_id: int, sharing: str) -> tuple[SequenceView, ...]:
    """The samples (in index order) or beams (live ones by rank, then pruned ones, newest first) of
    ``request_id`` after the last of ``reports``."""
    texts = sequence_texts(reports, request_id)
    ended, scores = {}, {}
    for report in reports:
        ended.update(getattr(report, "seq_finished", {}).get(request_id, {}))
        scores.update(getattr(report, "beam_scores", {}).get(request_id, {}))
    if sharing != SHARING_BEAM:
        return tuple(SequenceView(seq_id, i, text, ended.get(seq_id, "live")) for i, (seq_id, text) in enumerate(texts.items()))
    views = [SequenceView(seq_id, scores[seq_id].rank if seq_id in scores else 0, text,
                          ended.get(seq_id, "live"), *((scores[seq_id].cumulative_logprob, scores[seq_id].score)
                                                       if seq_id in scores else (None, None)))
             for seq_id, text in texts.items()]
    kept = sorted((v for v in views if v.state != PRUNED), key=lambda v: v.index)
    pruned = sorted((v for v in views if v.state == PRUNED), key=lambda v: -v.seq_id)
    return tuple(kept + pruned)


def final_beam_views(outputs: list, reason: str) -> tuple[SequenceView, ...]:
    """A finished beam search's hypotheses (``CompletionOutput``s, best first) as beam rows: rank, text,
    log-probability; no sequence id (negative: a hypothesis outlives the sequence that held it)."""
    return tuple(SequenceView(-1 - rank, rank, o.text, o.finish_reason or reason, o.cumulative_logprob)
                 for rank, o in enumerate(outputs))


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
