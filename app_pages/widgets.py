"""Choice widgets whose option labels are translated.

When the language changes, the labels of a radio or selectbox change while its key stays the same,
and the browser then shows no option selected (the server still has the old value). So each language
gets its own widget (key ``<key>__<lang>``), and the choice itself lives under ``<key>`` in
session_state, copied into whichever widget is drawn. Callbacks (e.g. presets) set ``<key>``.
"""

from __future__ import annotations

import streamlit as st


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
