"""Small helpers several pages share: building the engine with a progress bar, PNG downloads."""

from __future__ import annotations

import html
import io
import os
import re

import matplotlib

matplotlib.use("Agg")  # the server draws into memory, never to a window
import matplotlib.pyplot as plt
import streamlit as st

from app_pages.state import clean_workload, preset_workload, session_engine
from visualize.i18n import t


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~$:&=^])")
_MARKDOWN_INLINE = re.compile(r"([\\`*_\[\]()!|~$:])")  # inline constructs: links, images, emphasis, code, :directives:


def plain(text) -> str:
    """``text`` (from a file, a model or an error message) shown as itself by st.markdown, st.caption,
    st.info, st.error...: every character Markdown (or Streamlit's ``:color[...]`` and ``:icon:``) would
    act on is backslash-escaped, so a link, an image (fetched from its server), a ``javascript:`` URL or
    HTML in it shows as the characters it is, and newlines as spaces."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(str(text).split()))


def html_text(text) -> str:
    """``text`` inside the app's own HTML (``unsafe_allow_html``): HTML-escaped, and every character that
    Markdown acts on as a character reference (shown the same), so that nothing in it is Markdown even
    where a blank line in it would end the HTML block."""
    escaped = _MARKDOWN_INLINE.sub(lambda m: f"&#{ord(m.group(1))};", html.escape(str(text), quote=True))
    return escaped.replace("\r", "&#13;").replace("\n", "&#10;")


LOCAL_ADDRESSES = ("127.0.0.1", "localhost", "::1")
MAX_UPLOAD_MB = 1  # .streamlit/config.toml's server.maxUploadSize: workload and run files are a few KB to 1 MB
REMOTE_ENV = "PAGEDATTENTION_LAB_ALLOW_REMOTE"  # "1": serve other machines too (a teacher's own choice)


def serving_problem() -> str | None:
    """What is wrong with how this server was started, or None: it serves this machine only (``server.address``
    a loopback address) and takes uploads of at most 1 MB (``server.maxUploadSize``), whichever directory
    ``streamlit run`` was started from (Streamlit reads ``.streamlit/config.toml`` next to app.py from 1.46
    on, and the working directory's too; flags and ``STREAMLIT_*`` variables override both).
    ``PAGEDATTENTION_LAB_ALLOW_REMOTE=1`` lets a teacher serve other machines on purpose."""
    from streamlit import config

    if config._main_script_path is None:  # not served by `streamlit run` (AppTest, a bare script): no server to check
        return None
    address = st.get_option("server.address")
    if os.environ.get(REMOTE_ENV) != "1" and address not in LOCAL_ADDRESSES:
        return f"server.address is {address or 'unset (every network interface)'}"
    if st.get_option("server.maxUploadSize") > MAX_UPLOAD_MB:
        return f"server.maxUploadSize is {st.get_option('server.maxUploadSize')} MB"
    return None


def refuse_unsafe_serving(lang: str) -> None:
    """Stop the page with one message when the server was started open to other machines or with a larger
    upload cap than the app's (see :func:`serving_problem`); nothing else of the app is served then."""
    problem = serving_problem()
    if problem is not None:
        st.error(t("serving_refused", lang, problem=plain(problem), env=REMOTE_ENV))
        st.stop()


def progress_bar(lang: str, model: str):
    """A progress bar and the ``progress(stage, fraction)`` callback that drives it (model fetch/convert)."""
    bar = st.empty()

    def progress(stage: str, fraction: float) -> None:
        bar.progress(min(max(fraction, 0.0), 1.0), text=f"{t('loading_model', lang, model=model)} {stage}")

    return bar, progress


def workload_rows() -> list[tuple[str, int]]:
    """The session's workload (the editor's last value, or the short-chat preset)."""
    frame = st.session_state.get("workload_df")
    if frame is None:
        frame = st.session_state["workload_df"] = preset_workload("preset_short_chat")
    return clean_workload(frame)


def current_engine(lang: str, force: bool = False):
    """This session's engine for the sidebar settings and workload; errors shown, None if it failed."""
    settings = st.session_state["settings"]
    bar, progress = progress_bar(lang, settings.model)
    with st.spinner(t("building_engine", lang)):
        llm, errors = session_engine(settings, workload_rows(), progress, force=force)
    bar.empty()
    for row, error in errors:
        if row == "engine":
            st.error(t("error_engine", lang, error=plain(error)))
        else:
            st.warning(t("error_request", lang, row=row, error=plain(error)))
    return llm


def png_download(label: str, make_figure, file_name: str, key: str) -> None:
    """A download button that draws the matplotlib figure only when clicked (for slides)."""

    def png() -> bytes:
        fig = make_figure()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=150, bbox_inches="tight")
        plt.close(fig)
        return buf.getvalue()

    st.download_button(label, png, file_name=file_name, mime="image/png", key=key)


def category_help(lang: str) -> None:
    """A folded explanation of the paper's memory categories, next to a chart that draws them."""
    with st.expander(t("category_help_title", lang), icon=":material/help:"):
        st.markdown(t("category_help", lang))
