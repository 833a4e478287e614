"""Choice widgets whose option labels are translated.

When the language changes, the labels of a radio or selectbox change while its key stays the same,
and the browser then shows no option selected (the server still has the old value). So each language
gets its own widget (key ``<key>__<lang>``), and the choice itself lives under ``<key>`` in
session_state, copied into whichever widget is drawn. Callbacks (e.g. presets) set ``<key>``.
"""

from __future__ import annotations

import streamlit as st

from visualize.i18n import t


def localized_choice(widget, label: str, options, key: str, lang: str, format_func, default=None, **kwargs):
    """``widget`` (e.g. ``st.radio``, ``st.sidebar.selectbox``) over ``options`` whose value survives
    a language switch; returns the chosen option."""
    state = st.session_state
    value = state.get(key, options[0] if default is None else default)
    if value not in options:
        value = options[0]
    widget_key = f"{key}__{lang}"
    state[widget_key] = value  # set before the widget is drawn, so it shows the current choice

    def remember() -> None:  # runs before the rerun a click causes, so ``key`` is fresh above
        state[key] = state[widget_key]

    chosen = widget(label, options, key=widget_key, format_func=format_func, on_change=remember, **kwargs)
    state[key] = chosen
    return chosen


def json_uploader(container, label: str, key: str, lang: str, **kwargs):
    """``container.file_uploader`` for one JSON file, with a line under it that gives the size limit and
    what a file over it looks like: the browser refuses it before sending, so the app never sees it
    (Streamlit's chip turns red). Its button and size line ("Upload", "8MB per file • JSON") are
    Streamlit's own English; in 中文 the line says what they mean too."""
    from app_pages.common import MAX_UPLOAD_MB

    upload = container.file_uploader(label, type=["json"], key=key, **kwargs)
    container.caption(t("uploader_words", lang, mb=MAX_UPLOAD_MB))
    return upload


def bounded_number(container, label: str, key: str, lo, hi, lang: str, **kwargs):
    """A number box in ``container`` (e.g. ``st.sidebar``) whose value lives under ``key`` and is kept
    in [lo, hi]; returns the value used (of ``lo``'s type).

    The box itself has no min/max: a browser would only turn an out-of-range entry red and keep the
    old value without a word. Here an entry outside the bounds is moved to the nearest bound, and a
    note under the box says what was typed, what is used and why. The value also survives the box not
    being drawn for a while (another pool unit chosen), which a widget's own state does not.
    """
    state = st.session_state
    widget_key, note_key = f"{key}__input", f"{key}__note"

    def clamp(value):
        return min(max(type(lo)(value), lo), hi)

    if clamp(state[key]) != state[key]:  # the bounds moved (another model or block size)
        state[note_key], state[key] = (state[key], clamp(state[key])), clamp(state[key])
    state[widget_key] = state[key]

    def remember() -> None:
        raw = state[widget_key]
        if raw is not None:
            state[key] = clamp(raw)
        state[note_key] = (raw, state[key]) if raw is not None and state[key] != raw else None

    container.number_input(label, key=widget_key, on_change=remember, **kwargs)
    note = state.get(note_key)
    if note:
        fmt = kwargs.get("format") or "%d"
        container.warning(t("value_clamped", lang, typed=fmt % note[0], used=fmt % note[1], lo=fmt % lo, hi=fmt % hi))
    return state[key]
