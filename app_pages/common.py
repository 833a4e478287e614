"""Small helpers several pages share: building the engine with a progress bar, PNG downloads."""

from __future__ import annotations

import html
import io
import os
import re
import threading
import time

import matplotlib

matplotlib.use("Agg")  # the server draws into memory, never to a window
import matplotlib.pyplot as plt
import streamlit as st

from app_pages.presets import preset_workload
from app_pages.state import clean_workload, session_engine
from engine.model_executor.model_loader import DEFAULT_MODEL, resolve_model
from visualize.i18n import error_text, t


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
MAX_UPLOAD_MB = 8  # .streamlit/config.toml's server.maxUploadSize: workload files are a few KB, a 700-step class session's run file about 1 MB
REMOTE_ENV = "PAGEDATTENTION_LAB_ALLOW_REMOTE"  # "1": serve other machines too (a teacher's own choice)


def serving_problem() -> str | None:
    """What is wrong with how this server was started, or None: it serves this machine only (``server.address``
    a loopback address) and takes uploads of at most ``MAX_UPLOAD_MB`` (``server.maxUploadSize``), whichever directory
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


STAGES = (  # (the start of engine.model_executor.model_loader's / engine.cpu.ops's stage text, its i18n key)
    ("Downloading", "stage_download"), ("Assembling", "stage_assemble"), ("Extracting", "stage_check"), ("Checking sha256", "stage_check"),
    ("Converting", "stage_convert"), ("The converted model", "stage_reconvert"), ("Loading weights", "stage_weights"),
    ("Building the engine's CPU kernels", "stage_kernels"), ("Waiting for process", "stage_kernels"),
)


def stage_text(stage: str, lang: str, kernels_building: bool = False, seconds: int = 0) -> str:
    """A loading stage in the reader's language (an unknown stage keeps its own text), and, while the CPU
    kernels compile in the background, a line that says so."""
    key = next((k for prefix, k in STAGES if stage.startswith(prefix)), None)
    text = t(key, lang, seconds=seconds) if key else stage
    if kernels_building and key != "stage_kernels":
        text += "  \n" + t("stage_kernels_meanwhile", lang)
    return text


def progress_bar(lang: str, model: str):
    """A progress bar and the ``progress(stage, fraction)`` callback that drives it (model fetch/convert),
    with a plain note of what the default model is while it is fetched."""
    bar, note = st.empty(), st.empty()
    started = time.monotonic()

    def progress(stage: str, fraction: float) -> None:
        if model == DEFAULT_MODEL:
            note.caption(t("first_start_model", lang))
        text = stage_text(stage, lang, kernel_build_running())
        seconds = t("stage_elapsed", lang, seconds=int(time.monotonic() - started))
        bar.progress(min(max(fraction, 0.0), 1.0), text=f"{t('loading_model', lang, model=plain(model))} {text}  \n{seconds}")

    class Both:  # bar.empty() clears the note too
        def empty(self) -> None:
            bar.empty()
            note.empty()

    return Both(), progress


_kernel_thread: dict[str, threading.Thread] = {}


def start_kernel_build() -> None:
    """Compile the engine's CPU kernels in the background (once per server process, CPU machines only), so that
    a first start downloads and converts the model meanwhile instead of one after the other."""
    from engine.cpu import ops as cpu_ops

    if cpu_ops.attempted() or "thread" in _kernel_thread or torch_cuda_available():
        return
    thread = threading.Thread(target=cpu_ops.load_kernel, name="cpu-kernel-build", daemon=True)
    _kernel_thread["thread"] = thread
    _kernel_thread["started"] = time.monotonic()
    thread.start()


def kernel_build_running() -> bool:
    thread = _kernel_thread.get("thread")
    return thread is not None and thread.is_alive()


def wait_for_kernel_build(lang: str) -> None:
    """While the background build runs: one line that says so, with the seconds so far, until it ends."""
    if not kernel_build_running():
        return
    line = st.empty()
    thread = _kernel_thread["thread"]
    while thread.is_alive():
        seconds = int(time.monotonic() - _kernel_thread["started"])
        line.info(t("stage_kernels", lang, seconds=seconds), icon=":material/build:")
        thread.join(timeout=1.0)
    line.empty()


def torch_cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def workload_rows() -> list[tuple[str, int]]:
    """The session's workload (the editor's last value, or the short-chat preset)."""
    frame = st.session_state.get("workload_df")
    if frame is None:
        frame = st.session_state["workload_df"] = preset_workload("preset_short_chat")
    return clean_workload(frame)


def current_engine(lang: str, force: bool = False):
    """This session's engine for the sidebar settings and workload; errors shown, None if it failed."""
    settings = st.session_state["settings"]
    start_kernel_build()  # compiles while the model is fetched and converted (a first start), else returns at once
    bar, progress = progress_bar(lang, settings.model)
    with st.spinner(t("building_engine", lang)):
        if kernel_build_running():  # a first start: the model first (download, conversion: on the bar), then the
            try:  # kernels' remaining compile time (said with its seconds); resolve_model is a no-op once cached
                resolve_model(None if settings.model == DEFAULT_MODEL else settings.model, progress)
            except Exception:  # noqa: BLE001 - session_engine below says what is wrong with the model
                pass
            bar.empty()  # the model is ready: its last stage ("Converting ...") and clock would stand still beside the build's
            wait_for_kernel_build(lang)
        llm, errors = session_engine(settings, workload_rows(), progress, force=force)
    bar.empty()
    for row, error in errors:
        if row == "engine":
            st.error(t("error_engine", lang, error=plain(error_text(error, lang))))
        else:
            st.warning(t("error_request", lang, row=row, error=plain(error_text(error, lang))))
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
