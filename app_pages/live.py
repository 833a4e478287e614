"""Live engine page: step a real model and watch its requests fill the KV block pool."""

from __future__ import annotations

import html
from collections import Counter

import pandas as pd
import streamlit as st

from app_pages import beside_panel, prefix_panel, swap_panel, timeline_panel
from app_pages.kv_groups_panel import kv_groups_view, swatch_html, table_cells_html
from app_pages.common import category_help, current_engine, html_text, plain, png_download
from app_pages.sidebar import show_capacity
from app_pages.widgets import localized_choice
from app_pages.replay import follow_newest, replay_index, request_views, status_text
from app_pages.saved import close_run, save_and_open, save_run_button
from app_pages.presets import PRESETS, PROMPT_TRANSLATIONS, preset_settings, preset_workload
from app_pages.state import (MAX_NEW_TOKENS, MAX_PROMPT_CHARS, MAX_REQUESTS, clean_workload, add_next_chat_turn,
                             prefix_cache_entries, record)
from engine.report import FORK
from visualize.beam_tree import beam_tree_spec
from visualize.classroom import blocks_of, highlight_blocks
from visualize.colors import (COW_DST_BORDER, COW_SRC_BORDER, EDGE_COLOR, ROLLBACK_COLOR, SHARED_BORDER, SHARED_COLOR,
                              TOUCHED_COLOR, request_color)
from visualize.i18n import CATALOGUE, error_text, t
from visualize.kv_groups import NULL_COLOR, group_color, group_label
from visualize.memory import memory_chart, memory_figure, memory_frame
from visualize.pool import (block_tables_figure, copy_on_write_pairs, cow_sides, event_log_rows, free_queue_cells, num_blocks_of,
                            pool_map_figure, pool_map_spec)
from visualize.prefix import cached_and_computed
from visualize.radix import latest_matches, prefix_match_html


def page() -> None:
    lang = st.session_state["lang"]
    st.title(t("app_title", lang))
    st.caption(t("live_intro", lang))
    layout_choice(lang)
    run = st.session_state.get("loaded_run")
    if run is not None:  # a saved run: replayed from its reports, no model needed
        workload_editor(lang)
        saved_run_view(run, lang)
        return
    # The editor first: an edit reruns the whole script, and the engine below must be built from the
    # edited rows in that same run (a Step afterwards reruns only the live fragment).
    workload_editor(lang)
    impl = beside_panel.chosen()  # a student's lab parts, stepped beside the engine's from step 0
    force = st.session_state.pop("force_reset", False) or impl != st.session_state.get("beside_for")
    llm = current_engine(lang, force=force)
    beside_panel.ensure(llm, impl, lang)
    show_capacity(llm, lang)
    if llm is None:
        return
    playing = st.session_state.get("playing", False)
    speed = float(st.session_state.get("speed", 1.0))
    # Only this fragment reruns on Step / Play ticks: no full-page flicker, the sidebar stays put.
    st.fragment(run_every=speed if playing else None)(live_view)()


# ---- workload ------------------------------------------------------------------------------


def _load_preset() -> None:
    """Button callback (runs before the script, so it may set the sidebar's settings): the preset's
    workload and every setting its demo depends on (``presets.preset_settings``), nothing left behind."""
    state = st.session_state
    name = state["preset"]
    state["workload_df"] = preset_workload(name)
    on_preset_model = state.get("model_choice") == "gemma" or state.get("model_path") in {p["model"] for p in PRESETS.values() if "model" in p}
    if "model" not in PRESETS[name] and on_preset_model:
        state.update(model_choice="default", model_path="")  # back from a preset's own model to the default one
    state.update(preset_settings(name))
    state["pool_unit_shown"] = "blocks"  # the pool size is in blocks: no MiB to carry over
    state["preset_note"] = f"{name}_note" if f"{name}_note" in CATALOGUE else None
    state["editor_version"] = state.get("editor_version", 0) + 1  # a fresh editor


def layout_choice(lang: str) -> None:
    localized_choice(st.radio, t("layout", lang), ("normal", "projector"), "layout", lang, lambda v: t(f"layout_{v}", lang),
                     horizontal=True, help=t("layout_help", lang))


def projector() -> bool:
    return st.session_state.get("layout") == "projector"


def workload_editor(lang: str) -> None:
    with st.expander(t("workload", lang), icon=":material/edit_note:"):
        cols = st.columns([3, 1])
        localized_choice(cols[0].selectbox, t("preset", lang), list(PRESETS), "preset", lang, lambda p: t(p, lang))
        cols[1].button(t("load_preset", lang), on_click=_load_preset, width="stretch")
        if "workload_df" not in st.session_state:
            st.session_state["workload_df"] = preset_workload("preset_short_chat")
        edited = st.data_editor(
            st.session_state["workload_df"], num_rows="dynamic", width="stretch",
            key=f"workload_editor_{st.session_state.get('editor_version', 0)}",
            column_config={
                # No limits here: the browser would refuse or cut an entry without a word; workload_notes says what is used.
                "prompt": st.column_config.TextColumn(t("prompt", lang), width="large"),
                "max_tokens": st.column_config.NumberColumn(t("max_tokens", lang), step=1, default=32, format="%d"),
            },
        )
        st.toggle(t("chat_mode", lang), key="chat", help=t("chat_mode_help", lang))
        st.caption(t("workload_help", lang) + " " + t("too_many_requests", lang, n=MAX_REQUESTS))
        if st.session_state.get("preset_note"):  # why the loaded preset limits the batch
            st.caption(t(st.session_state["preset_note"], lang))
        st.session_state["workload_df"] = edited
        for note in workload_notes(edited, lang):
            st.warning(note)
        save_and_open(st.session_state["settings"], clean_workload(edited), lang)


def workload_notes(frame, lang: str) -> list[str]:
    """What clean_workload changes in the editor's rows, and why, row by row (shown under the editor)."""
    notes, kept = [], 0
    for row, (prompt, max_tokens) in enumerate(zip(frame["prompt"], frame["max_tokens"])):
        if not isinstance(prompt, str) or not prompt.strip():
            notes.append(t("note_empty_prompt", lang, row=row))
            continue
        kept += 1
        if len(prompt) > MAX_PROMPT_CHARS:
            notes.append(t("note_long_prompt", lang, row=row, n=len(prompt), max=MAX_PROMPT_CHARS))
        used = clean_workload(frame.iloc[[row]])[0][1]
        note = _max_tokens_note(max_tokens, used)
        if note:
            notes.append(t(note, lang, row=row, value=_number(max_tokens), max=MAX_NEW_TOKENS, used=used))
    if kept > MAX_REQUESTS:
        notes.append(t("too_many_requests", lang, n=MAX_REQUESTS))
    return notes


def _max_tokens_note(value, used: int) -> str | None:
    """The note's key for a max-tokens cell that is not used as typed: empty, not whole, out of range."""
    if value is None or value != value or (isinstance(value, str) and not value.strip()):  # None, NaN, ""
        return "note_max_tokens_empty"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "note_max_tokens"
    if not number.is_integer():
        return "note_max_tokens"
    return "note_max_tokens_range" if number != used else None


def _number(value) -> str:
    """A cell's number as typed: 100000, not 100000.0 (the editor's column turns float once a cell is empty)."""
    return str(int(value)) if isinstance(value, float) and value == value and value.is_integer() else str(value)


# ---- controls and the live view ------------------------------------------------------------


def _step(llm, lang: str, n: int = 1) -> None:
    for _ in range(n):
        if not llm.has_unfinished_requests():
            break
        try:
            record(beside_panel.step_beside(llm.step), prefix_cache_entries(llm))
            # chat mode: the next turn once this one is done
            turn = add_next_chat_turn(llm, st.session_state.get("chat_turns"), st.session_state["settings"])
            if turn is not None:
                st.session_state["request_ids"].append(turn)
        except Exception as error:  # keep the page alive and say what went wrong
            st.error(t("error_step", lang, error=plain(error_text(error, lang))))
            st.session_state["playing"] = False
            break


def controls(llm, lang: str) -> None:
    c = st.columns([1, 0.6, 1.2, 1, 1.4, 1])
    stepped = c[0].button(t("step", lang), type="primary", width="stretch", key="btn_step")
    n = int(c[1].number_input(t("n_steps", lang), 1, 200, 10, key="n_steps", label_visibility="collapsed"))
    run_n = c[2].button(t("run_n", lang), width="stretch", key="btn_run")
    playing = st.session_state.get("playing", False)
    toggled = c[3].button(t("pause", lang) if playing else t("play", lang), width="stretch", key="btn_play")
    c[4].select_slider(t("speed", lang), [0.25, 0.5, 1.0, 2.0], value=1.0, key="speed", label_visibility="collapsed",
                       format_func=lambda s: f"{s:g} s")
    reset = c[5].button(t("reset", lang), width="stretch", key="btn_reset")
    if reset:
        st.session_state["playing"] = False
        st.session_state["force_reset"] = True
        st.rerun()
    if toggled:
        st.session_state["playing"] = not playing
        st.session_state["play_ticks"] = []
        st.rerun()  # the whole page, so the fragment is rebuilt with (or without) its timer
    if stepped or run_n:
        follow_newest()
    if stepped:
        _step(llm, lang)
    elif run_n:
        _step(llm, lang, n)
    elif playing:
        _step(llm, lang)  # a timer tick
        play_pace(lang)
        if not llm.has_unfinished_requests():
            st.session_state["playing"] = False
            st.rerun()


def play_pace(lang: str) -> None:
    """While playing: when a step and its redraw take longer than the chosen interval, the ticks come
    late and Play runs slower than asked; say so, with the pace measured over the last ticks."""
    import time

    ticks = st.session_state.setdefault("play_ticks", [])
    ticks.append(time.perf_counter())
    del ticks[:-6]
    asked = float(st.session_state.get("speed", 1.0))
    if len(ticks) >= 3:
        pace = (ticks[-1] - ticks[0]) / (len(ticks) - 1)
        if pace > 1.25 * asked:
            st.caption(t("play_slower", lang, asked=f"{asked:g}", pace=f"{pace:.1f}"))


def live_view() -> None:
    lang = st.session_state["lang"]
    llm = st.session_state.get("engine")
    if llm is None:
        return
    controls(llm, lang)
    reports = st.session_state.get("reports", [])
    beside_panel.view(reports, llm.config.block_size, lang, block_tables_html, pool_view)
    prompts = live_prompts(llm, st.session_state.get("request_ids", []), st.session_state.get("chat_turns"))
    if not reports:
        st.info(t("no_steps_yet", lang))
        views = request_views(prompts, [_empty_report(llm)], 0)
        if projector():
            with st.expander(t("requests", lang)):
                requests_text(views, lang)
        else:
            requests_text(views, lang)
        return
    show_step(prompts, reports, llm.config.block_size, lang, st.session_state.get("cache_entries"), finished_beams(llm, prompts))
    save_run_button(llm, prompts, reports, lang)
    if not llm.has_unfinished_requests():
        st.success(t("all_done", lang))


def saved_run_view(run, lang: str) -> None:
    st.info(t("saved_run_banner", lang, name=plain(st.session_state.get("loaded_run_name", "run.json")), steps=len(run.steps),
              model=plain(run.engine.get("model_name"))))  # a file's text, shown as text
    st.button(t("close_run", lang), on_click=close_run, key="btn_close_run")
    show_step(run.prompts, run.steps, run.engine["block_size"], lang, labels=st.session_state.get("loaded_run_clients"))


def finished_beams(llm, request_ids) -> dict[int, list]:
    """Each finished request with several outputs: its final outputs (beam search: the hypotheses, best first)."""
    outputs = {}
    for rid in request_ids:
        out = llm.get_output(rid)
        if out.finished and len(out.outputs) > 1:
            outputs[rid] = out.outputs
    return outputs


def show_step(prompts: dict[int, str], reports: list, block_size: int, lang: str, caches: dict | None = None,
              final_beams: dict | None = None, labels: dict[int, str] | None = None, highlight: set[int] | None = None,
              fold_finished: bool = False) -> None:
    """The step the replay slider points at (the newest by default): summary, texts, pool, tables, memory, events.

    ``caches``: step -> ``PrefixCache.entries()`` after it (the live engine's; a saved run has none).
    ``final_beams``: finished beam searches' hypotheses (see ``replay.request_views``).
    ``labels``: request id -> its client's name (a classroom server's requests); ``highlight``:
    request ids whose blocks are outlined on the pool map (a student's own); ``fold_finished``: the
    desk layout lists finished requests folded under the others (a class's many requests would push
    the block tables screens down)."""
    at = replay_index(reports, lang)
    report, views = reports[at], request_views(prompts, reports, at, final_beams)
    split = cached_and_computed(reports[: at + 1], block_size) if report.prefix_cache is not None else None
    matches = latest_matches(reports[: at + 1]) if report.prefix_cache is not None else None
    spec = spec_per_request(reports[: at + 1])
    cache = (caches or {}).get(report.step)
    step_summary(report, views, lang)
    if projector():  # the pool map and block tables large and first, the texts folded
        pool_view(report, block_size, lang, large=True, cache=cache, highlight=highlight)
        prefix_panel.radix_and_tier(report, lang, large=True)
        swap_panel.queues_caption(report, views, lang)
        swap_panel.cpu_lane(report, block_size, lang, large=True)
        block_tables_html(report, block_size, lang, large=True, sharing={v.request_id: v.sharing for v in views}, labels=labels)
        swap_panel.prefill_bars(reports, at, lang)
        with st.expander(t("requests", lang)):
            requests_text(views, lang, split, labels, spec, matches=matches)
        memory_view(reports[: at + 1], lang)
    else:
        left, right = st.columns([1, 1.2])
        with left:
            done = [v for v in views if fold_finished and v.status == "finished"]
            requests_text([v for v in views if not (fold_finished and v.status == "finished")], lang, split, labels, spec, matches=matches)
            if done:
                with st.expander(t("finished_requests", lang, n=len(done))):
                    requests_text(done, lang, split, labels, spec, heading=False, matches=matches)
            swap_panel.prefill_bars(reports, at, lang)
            block_tables_html(report, block_size, lang, sharing={v.request_id: v.sharing for v in views}, labels=labels)
        with right:
            pool_view(report, block_size, lang, cache=cache, highlight=highlight)
            prefix_panel.radix_and_tier(report, lang)
            swap_panel.queues_caption(report, views, lang)
            swap_panel.cpu_lane(report, block_size, lang)
            memory_view(reports[: at + 1], lang)
    kv_groups_view(report, reports[: at + 1], num_blocks_of(report, block_size), block_size, lang)
    beam_tree_view(reports[: at + 1], lang)
    timeline_panel.timeline_view(reports[: at + 1], lang, labels=labels)
    events_view(report, lang)


def beam_tree_view(reports: list, lang: str) -> None:
    """A beam tree per beam-search request seen so far (forks, pruned branches greyed)."""
    # Parallel samples fork once, after the prompt's prefill; beams fork again as they branch.
    fork_steps = Counter((e.request_id, r.step) for r in reports for e in r.events if e.kind == FORK)
    beam_requests = sorted(rid for rid, n in Counter(rid for rid, _ in fork_steps).items() if n > 1)
    for request_id in beam_requests:
        st.markdown(f"**{t('beam_tree_title', lang)} · {t('request', lang)} {request_id}**")
        st.vega_lite_chart(beam_tree_spec(reports, request_id, lang), width="stretch")
        st.caption(t("beam_tree_caption", lang))


def live_prompts(llm, request_ids: list[int], chat=None) -> dict[int, str]:
    """Each request's prompt as the user wrote it; in chat mode (``chat``: the ``ChatTurns`` in ``st.session_state``)
    each turn's own question: a later turn is sent as token ids (its history, answers included), which
    the request list would show whole, and untranslated in 中文."""
    prompts = {rid: llm.get_output(rid).prompt_text.strip() for rid in sorted(request_ids)}
    if chat is not None:
        prompts.update({rid: question.strip() for rid, (question, _) in zip(request_ids, chat.rows)})
    return prompts


def _empty_report(llm):
    """A stand-in for 'before the first step': nothing scheduled, nothing held."""
    from engine.report import StepReport

    return StepReport(step=-1, phase="idle", scheduled=[], new_token_ids={}, new_text={}, finished={}, preempted=[],
                      events=[], block_tables=[], memory=llm.memory_usage())


def step_summary(report, views, lang: str) -> None:
    st.subheader(t("step_summary", lang, step=report.step))
    c = st.columns(6)
    c[0].metric(t("phase", lang), t(f"phase_{report.phase}", lang))
    c[1].metric(t("scheduled", lang), len(report.scheduled))
    c[2].metric(t("tokens_processed", lang), report.num_tokens)
    c[3].metric(t("step_time", lang), f"{report.timings_ms.get('total', 0):.0f} ms")
    c[4].metric(t("preemptions_step", lang), len(report.preempted))
    c[5].metric(t("memory_saved_by_sharing", lang), f"{getattr(report.memory, 'memory_saved_by_sharing', 0.0):.1%}",
                help=t("memory_saved_help", lang))
    if getattr(report, "spec", None):  # speculative decoding: the step's verifications
        s = st.columns(6)
        s[0].metric(t("spec_acceptance_rate", lang), f"{report.spec_acceptance_rate:.0%}", help=t("spec_acceptance_help", lang))
        s[1].metric(t("spec_accepted_length", lang), f"{report.spec_mean_accepted_length:.2f}",
                    help=t("spec_accepted_length_help", lang))
    colon = t("sep_colon", lang)  # the separators too are the reader's language: "：" and "、" in Chinese
    timings = t("sep_list", lang).join(f"{_timing_name(k, lang)} {v:.1f}" for k, v in report.timings_ms.items() if k != "total")
    count = {s: sum(1 for v in views if v.status == s) for s in ("running", "swapped", "finished")}
    waiting = len(views) - sum(count.values())
    if count["swapped"] or getattr(report, "cpu_memory", None) is not None:  # swap preemption: the third queue too
        queues = f"{t('running_waiting_swapped', lang)}{colon}{count['running']} / {waiting} / {count['swapped']} / {count['finished']}"
    else:
        queues = f"{t('running_waiting', lang)}{colon}{count['running']} / {waiting} / {count['finished']}"
    st.caption(f"{t('time_per_phase', lang)}{colon}{timings} · {queues}")
    if getattr(report, "admissions", None):  # scheduling_policy "lpm": who was admitted, and why
        hits = {rid: hit for rid, _, hit in report.admissions}
        items = [t(f"admission_{reason}", lang, rid=rid, hit=hit) for rid, reason, hit in report.admissions]
        items += [t("admission_passed_over", lang, rid=rid, by=by, hit=hits.get(by, 0)) for rid, by in report.passed_over.items()]
        st.caption(f"{t('admissions_caption', lang)}{colon}{t('sep_list', lang).join(items)}")
    if getattr(report, "kv_offload", None) is not None:  # kv_offload_blocks: the CPU tier's traffic
        o = report.kv_offload
        st.caption(t("kv_offload_caption", lang, offloaded=len(o.offloaded), loaded=len(o.loaded), dropped=o.dropped,
                     gpu=o.gpu_cached_blocks, cpu=o.cpu_blocks, capacity=o.cpu_capacity))


def _timing_name(key: str, lang: str) -> str:
    """A phase of the step's timings in the reader's language (an unknown phase keeps its name)."""
    return t(f"timing_{key}", lang) if f"timing_{key}" in CATALOGUE else key


def spec_per_request(reports) -> dict[int, dict]:
    """Speculative decoding so far, per request id that verified drafts: proposed and accepted drafts
    (summed over ``reports``), and its acceptance rate and mean accepted length (the engine's, as of its
    latest verification)."""
    out: dict[int, dict] = {}
    for report in reports:
        for rid, o in getattr(report, "spec", {}).items():
            row = out.setdefault(rid, dict(proposed=0, accepted=0))
            row.update(proposed=row["proposed"] + len(o.proposed), accepted=row["accepted"] + o.accepted,
                       rate=o.acceptance_rate, length=o.mean_accepted_length)
    return out


def requests_text(views, lang: str, split: dict | None = None, labels: dict[int, str] | None = None,
                  spec: dict | None = None, heading: bool = True, matches: dict | None = None) -> None:
    """Each request's reply so far, in its colour; the prompt in grey; with prefix caching (``split``:
    request -> (cached, computed) tokens, ``visualize.prefix.cached_and_computed``) how much was cached,
    and (``matches``: request -> ``PrefixMatch``) its prompt with the prefix found cached highlighted;
    with speculative decoding (``spec``: :func:`spec_per_request`) its drafts and acceptance."""
    if heading:
        st.markdown(f"**{t('requests', lang)}**")
    parts = []
    for v in views:
        color = request_color(v.request_id)
        extra = f" · {t('preempted_times', lang, n=v.num_preemptions)}" if v.num_preemptions else ""
        if split and v.request_id in split:
            cached, computed = split[v.request_id]
            extra += (f' · <span data-testid="request-cached" title="{html.escape(t("cached_computed_help", lang))}">'
                      f'{t("cached_computed", lang, cached=cached, computed=computed)}</span>')
        if spec and v.request_id in spec:
            extra += f' · <span data-testid="request-spec">{html.escape(t("spec_request_stats", lang, **spec[v.request_id]))}</span>'
        parts.append(
            f'<div style="border-left:6px solid {color};padding:2px 8px;margin:4px 0">'
            f'<b style="color:{color}">{t("request", lang)} {v.request_id}{_label(v.request_id, labels)}</b> '
            f'<small style="color:#888">· {html_text(status_text(v, lang))} · {t("tok_count", lang, n=v.num_tokens)}'
            f'{extra}</small><br>'
            f'<span style="color:#888" data-testid="request-prompt">{html_text(_shorten(v.prompt))}</span>{_translation(v.prompt, lang)}'
            f'{prefix_match_html(matches[v.request_id], lang) if matches and v.request_id in matches else ""}'
            f'{_reply_html(v, color, lang)}</div>'
        )
    st.markdown("".join(parts), unsafe_allow_html=True)


def _reply_html(v, color: str, lang: str) -> str:
    """The request's text; with several sequences one line per sample, or per beam with its scores
    (pruned beams greyed and struck through); a finished beam search's result first."""
    if not v.sequences:
        return f'<br><span style="color:{color};white-space:pre-wrap" data-testid="request-text">{html_text(v.text)}</span>'
    lines = []
    if v.sharing == "beam" and v.status == "finished":
        lines.append(f'<b>{t("beam_result", lang)}</b>{t("sep_colon", lang)}<span style="color:{color};white-space:pre-wrap" data-testid="request-text">{html_text(v.text)}</span>')
    for s in v.sequences:
        if v.sharing != "beam":
            label = t("sample_label", lang, index=s.index)
            style = f"color:{color}"
        elif s.state == "pruned":
            label = t("beam_label_pruned", lang)
            style = "color:#aaa;text-decoration:line-through"
        else:
            label = t("beam_label", lang, rank=s.index)
            style = f"color:{color}"
        if s.score is not None and s.state != "pruned":
            label += " · " + t("beam_scores", lang, logprob=s.cumulative_logprob, score=s.score)
        elif v.sharing == "beam" and s.cumulative_logprob is not None and s.state != "pruned":  # a final hypothesis
            label += " · " + t("beam_logprob", lang, logprob=s.cumulative_logprob)
        lines.append(f'<small style="color:#888">{label}</small> '
                     f'<span style="{style};white-space:pre-wrap" data-testid="sequence-text">{html_text(s.text) or "…"}</span>')
    return "".join(f"<br>{line}" for line in lines)


def _label(request_id: int, labels: dict[int, str] | None) -> str:
    """" · alice": the request's client, HTML-escaped (a name a student typed), or nothing."""
    name = (labels or {}).get(request_id)
    return f' · <span data-testid="request-client">{html_text(name)}</span>' if name else ""


def _shorten(prompt: str, head: int = 100, tail: int = 60) -> str:
    """A long prompt's beginning and end (prompts that share a long beginning differ at the end)."""
    return prompt if len(prompt) <= head + tail else f"{prompt[:head]} … {prompt[-tail:]}"


def _translation(prompt: str, lang: str) -> str:
    """The Chinese of a preset prompt, beside it in 中文 (the default model answers English prompts best)."""
    zh = PROMPT_TRANSLATIONS.get(prompt)
    if lang != "zh" or not zh:
        return ""
    return f' <span style="color:#888">（{html.escape(zh)}）</span>'


def block_tables_html(report, block_size: int, lang: str, large: bool = False, sharing: dict | None = None,
                      labels: dict[int, str] | None = None, download: bool = True) -> None:
    """Each live sequence's block table (``sharing``: request id -> "none", "parallel" or "beam",
    which names a group's rows samples or beams; ``labels``: request id -> its client's name;
    ``download``: the PNG button, once per page)."""
    st.markdown(f"**{t('block_tables', lang)}**")
    st.caption(t("block_tables_caption", lang))
    if not report.block_tables:
        st.caption(t("no_live_requests", lang))
        return
    if report.kv_groups:  # a hybrid model: every group's tables, in the group's colour
        hybrid_block_tables_html(report, block_size, lang, large)
        return
    rows, font = [], 20 if large else 11
    several = Counter(snap.request_id for snap in report.block_tables)
    cow = cow_sides(report)
    for snap in report.block_tables:
        color = request_color(snap.request_id)
        refs = snap.ref_counts or [1] * len(snap.block_table)
        cells = "".join(
            f'<span data-testid="block-table-cell" title="{t("logical_index", lang)} {i} → {t("block", lang)} {b}: {f}/{block_size}; '
            f'{t("ref_count", lang)} {r}" '
            f'style="display:inline-block;min-width:34px;margin:1px;padding:1px 3px;border:{_cell_border(r, cow.get((b, snap.seq_id)))};'
            f'background:linear-gradient(90deg,{color} {100 * f / block_size:.0f}%,{color}40 0);font-size:{font}px;text-align:center">'
            f'<sup>{i}</sup>{b}{f"<sub style=color:{SHARED_COLOR}>×{r}</sub>" if r > 1 else ""}</span>'
            for i, (b, f, r) in enumerate(zip(snap.block_table, snap.filled, refs))
        )
        extra = (f' <small>{t("paren", lang, text=t("slot_range", lang, start=snap.slot_range[0], end=snap.slot_range[1]))}</small>'
                 if snap.slot_range else "")
        who = f"{t('request', lang)} {snap.request_id}{_label(snap.request_id, labels)}"
        if several[snap.request_id] > 1:  # a sequence group: one row per sequence
            key = "beam_index" if (sharing or {}).get(snap.request_id) == "beam" else "sequence_index"
            who += f" · {t(key, lang, index=snap.index, seq=snap.seq_id)}"
        rows.append(f'<div><b style="color:{color}">{who}</b>{extra}{t("sep_colon", lang)}{cells}</div>')
    st.markdown("".join(rows), unsafe_allow_html=True)
    if download:
        png_download(t("save_png", lang), lambda: block_tables_figure(report, block_size, lang), f"block_tables_step{report.step}.png", "png_tables")


def hybrid_block_tables_html(report, block_size: int, lang: str, large: bool = False) -> None:
    """A hybrid model's block tables: per request, one row per KV cache group, in the group's colour
    (as under KV cache groups and on the pool map); ∅ is the null block 0."""
    colon, font, rows = t("sep_colon", lang), 18 if large else 10, []
    for seq in report.block_tables:  # the full-attention group's: one per live sequence
        for g in report.kv_groups:
            color = group_color(report, g.group_id)
            for snap in (s for s in g.block_tables if s.seq_id == seq.seq_id):
                rows.append(f'<div data-testid="block-table-group" data-group="{g.group_id}">{swatch_html(color)}'
                            f'<b style="color:{request_color(snap.request_id)}">{t("request", lang)} {snap.request_id}</b> · '
                            f'{t("kv_group_short", lang, group=g.group_id)}{colon}{table_cells_html(snap, color, block_size, lang, font)}</div>')
    st.markdown("".join(rows), unsafe_allow_html=True)


def _cell_border(ref_count: int, cow: str | None) -> str:
    """A block table cell's CSS border, as the pool map draws the block: a copy-on-write of this step
    (source dashed, new copy solid, pink), else shared (dotted, slate), else plain."""
    (color, style, _, _), width = {"src": (COW_SRC_BORDER, 3), "dst": (COW_DST_BORDER, 3)}.get(
        cow or "", (SHARED_BORDER, 2) if ref_count > 1 else (("#555555", "solid", None, None), 1))
    return f"{width}px {style} {color}"


def pool_view(report, block_size: int, lang: str, large: bool = False, cache: dict | None = None,
              highlight: set[int] | None = None, outline: list[int] | None = None, download: bool = True,
              key: str | None = None) -> None:
    """The pool map and what goes with it. ``highlight``: request ids whose blocks are outlined (a
    student's own requests); ``outline``: block ids outlined (the first blocks where a student's lab parts
    differ from the engine's); ``download``: the PNG button, once per page; ``key``: the chart's, for a
    second pool map on the page."""
    st.markdown(f"**{t('pool', lang)}**")
    spec = swap_panel.mark_swaps(pool_map_spec(report, block_size, lang, cache=cache), report, lang)
    if highlight:  # a student's own blocks, outlined
        spec = highlight_blocks(spec, blocks_of(report, highlight))
    if outline:
        spec = highlight_blocks(spec, outline)
    if large:  # projector: taller cells, larger block numbers
        spec["height"] *= 2
        spec["layer"][-1]["mark"]["fontSize"] = 16
    st.vega_lite_chart(spec, width="stretch", key=key)
    st.caption(t("pool_caption_hybrid" if report.kv_groups else "pool_caption", lang))
    pool_legend(report, lang)
    if report.free_queue:  # paged: the order in which free blocks are handed out (and evicted)
        free_queue_html(report, lang, large)
    stats = getattr(report, "prefix_cache", None)
    if stats is not None:
        st.caption(t("pool_cache_caption", lang))
        st.caption(t("prefix_cache_caption", lang, hits=stats.hits, queries=stats.queries, rate=stats.hit_rate,
                     phits=stats.preempted_hits, pqueries=stats.preempted_queries, evictions=stats.evictions))
    if download:
        png_download(t("save_png", lang), lambda: pool_map_figure(report, block_size, lang), f"pool_step{report.step}.png", "png_pool")


def pool_legend(report, lang: str) -> None:
    """The pool map's outlines and badge, drawn as on the map: touched this step always; with shared
    blocks the ×n badge and the copy-on-write borders."""
    def box(style: str) -> str:
        return f'<span style="display:inline-block;width:18px;height:11px;vertical-align:middle;{style}"></span>'

    items = [(box(f"border:2.5px solid {TOUCHED_COLOR}"), t("legend_touched", lang))]
    if report.kv_groups:  # a hybrid model: blocks in their group's colour, the null block
        items += [(box(f"background:{group_color(report, g.group_id)};border:1px solid {EDGE_COLOR}"), group_label(g, lang))
                  for g in report.kv_groups]
        items.append((box(f"background:{NULL_COLOR};border:1px solid {EDGE_COLOR}"), t("null_block", lang)))
    spec = getattr(report, "spec", {})
    if any(s.tentative_slots for s in spec.values()):  # speculative decoding: the drafts' slots, those given back
        items.append((box(f"background:#eeeeee;border:1.5px dashed {EDGE_COLOR}"),
                      t("legend_tentative", lang)))
    if any(s.rolled_back_slots for s in spec.values()):
        items.append((box(f"border:2.5px dashed {ROLLBACK_COLOR}"), t("legend_rolled_back", lang)))
    if any(r > 1 for snap in report.block_tables for r in snap.ref_counts):
        items.append((box(f"border:2px {SHARED_BORDER[1]} {SHARED_BORDER[0]}")
                      + f' <b style="color:{SHARED_COLOR};font-size:11px">×n</b>', t("legend_shared", lang)))
    if copy_on_write_pairs(report):  # only a step that copied on write: the outlines it draws
        items.append((box(f"border:3px {COW_SRC_BORDER[1]} {COW_SRC_BORDER[0]}"), t("legend_cow_src", lang)))
        items.append((box(f"border:3px {COW_DST_BORDER[1]} {COW_DST_BORDER[0]}"), t("legend_cow_dst", lang)))
    st.markdown('<div data-testid="pool-legend" style="font-size:0.8rem;color:#555">'
                + " &nbsp; ".join(f"{mark} {html.escape(text)}" for mark, text in items) + "</div>", unsafe_allow_html=True)


def free_queue_html(report, lang: str, large: bool = False) -> None:
    """The free queue as a strip of cells, head (allocated and evicted next) on the left."""
    cells = free_queue_cells(report, lang)
    font = 16 if large else 10
    strip = "".join(
        f'<span title="{html.escape(c["state"])}" style="display:inline-block;min-width:24px;margin:1px;padding:1px 2px;'
        f'border:1px solid #555;background:{c["color"]};font-size:{font}px;text-align:center">{c["block"]}</span>'
        for c in cells)
    st.markdown(f'<div><small>{t("free_queue_title", lang, shown=len(cells), total=len(report.free_queue))}</small>'
                f'<br>{strip}</div>', unsafe_allow_html=True)


def memory_view(reports, lang: str) -> None:
    st.markdown(f"**{t('memory', lang)}**")
    unit = localized_choice(st.radio, t("memory_unit", lang), ("tokens", "MiB"), "memory_unit", lang,
                            lambda u: t("tokens", lang) if u == "tokens" else "MiB", horizontal=True, label_visibility="collapsed")
    frame = memory_frame(reports, unit)
    st.altair_chart(memory_chart(frame, unit, lang), width="stretch", height=300)
    st.caption(t("memory_caption", lang))
    if reports and reports[-1].kv_groups:
        st.caption(t("memory_caption_hybrid", lang))
    category_help(lang)
    png_download(t("save_png", lang), lambda: memory_figure(frame, unit, lang), "memory.png", "png_memory")


def events_view(report, lang: str) -> None:
    st.markdown(f"**{t('events', lang)}**")
    rows = event_log_rows(report, lang)
    if not rows:
        st.caption(t("no_events", lang))
        return
    frame = pd.DataFrame(rows)[["request_id", "event", "detail"]]
    frame.columns = [t("request", lang), t("event_kind", lang), t("event_detail", lang)]
    # Tall enough for a preemption's frees without scrolling (up to 20 rows; longer logs scroll).
    st.dataframe(frame, hide_index=True, width="stretch", height=38 + 35 * min(len(frame), 20))
