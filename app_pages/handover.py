"""Prefill/decode handover page: two engines of the sidebar's settings, the shared-memory KV connector
between them (``engine/disagg_pair.py``), stepped by hand; both pools and every block's move
(``visualize/handover.py``)."""

from __future__ import annotations

import streamlit as st

from app_pages.common import html_text, plain
from app_pages.state import MAX_NEW_TOKENS, MAX_PROMPT_CHARS, build_engine
from app_pages.widgets import localized_choice
from engine.disagg_pair import DisaggPair
from visualize.handover import (block_tables_html, handover_table_html, legend_html, moved_blocks, order_steps_html, pool_html,
                                request_numbers, short_id, story)
from visualize.i18n import error_text, t

DEFAULT_PROMPT = ("The capital of France is a city that many people visit because of its museums, its food, its long "
                  "history and the river that runs through it, and in spring its parks")
MAX_STEPS = 300  # Run to the end stops here


def page() -> None:
    lang = st.session_state["lang"]
    st.title(t("page_handover", lang))
    st.caption(t("ho_intro", lang))
    order = localized_choice(st.radio, t("ho_order", lang), ("pull", "push"), "ho_order", lang, lambda o: t(f"ho_order_{o}", lang),
                             horizontal=True, help=t("ho_order_help", lang))
    st.markdown(f"**{t('ho_order_title', lang)}**")
    st.markdown(order_steps_html(order, lang), unsafe_allow_html=True)
    c = st.columns([4, 1, 1])
    prompt = c[0].text_area(t("ho_prompt", lang), DEFAULT_PROMPT, max_chars=MAX_PROMPT_CHARS, height=68, key="ho_prompt")
    max_tokens = int(c[1].number_input(t("ho_max_tokens", lang), 1, MAX_NEW_TOKENS, 4, key="ho_max_tokens"))
    lease_s = float(c[2].number_input(t("ho_lease_s", lang), 1, 3600, 300, key="ho_lease_s", help=t("ho_lease_s_help", lang)))
    pair = current_pair(st.session_state["settings"], lease_s, order, lang)
    if pair is None:
        return
    b = st.columns(4)
    if b[0].button(t("ho_send", lang), key="ho_btn_send", width="stretch") and prompt.strip():
        try:
            rid = pair.add_request(prompt.strip(), max_tokens, st.session_state["settings"].temperature)
            room = pair.handovers[-1].bootstrap_room if order == "push" else None
            st.caption(t("ho_sent_push", lang, rid=rid, room=short_id(str(room))) if order == "push" else t("ho_sent", lang, rid=rid))
        except ValueError as error:
            st.error(plain(error_text(error, lang)))
    stepped = b[1].button(t("step", lang), type="primary", key="ho_btn_step", width="stretch")
    run_all = b[2].button(t("ho_run_all", lang), key="ho_btn_run", width="stretch")
    if b[3].button(t("reset", lang), key="ho_btn_reset", width="stretch"):
        close_pair()
        st.rerun()
    if stepped or run_all:
        for _ in range(MAX_STEPS if run_all else 1):
            if not pair.has_unfinished():
                break
            pair.step()
    view(pair.state(), lang, order)


def current_pair(settings, lease_s: float, order: str, lang: str) -> DisaggPair | None:
    """The browser session's pair for these settings and handover order, rebuilt (its history cleared) when they changed."""
    ss = st.session_state
    key = (settings, lease_s, order)
    if ss.get("ho_key") == key and ss.get("ho_pair") is not None:
        return ss["ho_pair"]
    close_pair()
    try:
        with st.spinner(t("ho_building", lang)):
            engines = [build_engine(settings, kv_transfer_config={"kv_role": role, "kv_lease_duration": lease_s, "kv_handover": order})
                       for role in ("kv_producer", "kv_consumer")]
            ss["ho_pair"] = DisaggPair(*engines)
    except Exception as error:  # noqa: BLE001 - a setting the connector cannot hand over: say why, keep the app alive
        st.error(t("ho_error", lang, error=plain(error_text(error, lang))))
        return None
    ss["ho_key"] = key
    return ss["ho_pair"]


def close_pair() -> None:
    pair = st.session_state.pop("ho_pair", None)
    st.session_state.pop("ho_key", None)
    if pair is not None:
        pair.close()


def view(state, lang: str, order: str = "pull") -> None:
    st.subheader(t("ho_step_title", lang, step=state.step) if state.step >= 0 else t("ho_before_first", lang))
    for line in story(state, lang):
        st.markdown(f'<div data-testid="ho-story">{html_text(line)}</div>', unsafe_allow_html=True)
    numbers = request_numbers(state)
    sent, received = moved_blocks(state)
    left, right = st.columns(2)
    for column, pool, moved, title in ((left, state.prefill, sent, "ho_prefill_instance"),
                                       (right, state.decode, received, "ho_decode_instance")):
        with column:
            st.markdown(f"**{t(title, lang)}**")
            st.caption(t("ho_pool", lang, used=len(pool.holders), total=pool.num_blocks))
            st.markdown(pool_html(pool, lang, numbers, moved), unsafe_allow_html=True)
            st.markdown(f"**{t('ho_tables', lang)}**")
            st.markdown(block_tables_html(pool, lang, numbers), unsafe_allow_html=True)
    st.markdown(legend_html(lang, order), unsafe_allow_html=True)
    st.markdown(f"**{t('ho_transfers', lang)}**")
    st.markdown(handover_table_html(state, lang), unsafe_allow_html=True)
    st.caption(t("ho_transfers_caption_push" if order == "push" else "ho_transfers_caption", lang))
    if state.texts:
        st.markdown(f"**{t('ho_replies', lang)}**")
        for rid, text in sorted(state.texts.items()):
            st.markdown(f'<div data-testid="ho-reply"><b>{t("request", lang)} {numbers.get(rid, rid)}</b>{t("sep_colon", lang)}'
                        f'{html_text(text)}</div>', unsafe_allow_html=True)
