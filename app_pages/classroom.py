"""Classroom page: the app attached to an engine server (``python -m engine serve``) that the whole
class sends requests to. Every step of the shared engine is drawn with the Live page's functions,
each request labelled by its client; the address to join is shown with its QR code; with the teacher
token the page has Step / Pause / Run controls (the server's lab endpoints, engine/entrypoints/lab.py).
"""

from __future__ import annotations

import base64
import secrets
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import streamlit as st

from app_pages import live
from app_pages.classroom_link import SPEEDS, Follower, ServerProcess, control, start_server, wait_ready
from app_pages.common import html_text, plain
from visualize.classroom import qr_svg
from visualize.i18n import t

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "http://127.0.0.1:8000"
DRAW_EVERY_S = 1.0  # the view's refresh while attached
ROOM_TEMPERATURES = (0.0, 0.7, 1.0)  # the room's sampling a started server may get (0: greedy)


class Classroom:
    """The app process's one classroom: the server it follows (and the one it started, if any).
    Shared by every browser session, the teacher's and the students'."""

    def __init__(self):
        self.lock = threading.Lock()
        self.follower: Follower | None = None
        self.server: ServerProcess | None = None
        self.token: str | None = None  # the teacher token, once a teacher proved it (or the app made it)

    @property
    def url(self) -> str | None:
        return self.follower.url if self.follower else None

    def attach(self, url: str, read_key: str | None, token: str | None) -> None:
        with self.lock:
            if self.follower is not None:
                self.follower.stop()
            self.follower = Follower(url.rstrip("/"), read_key or None)
            self.token = token or None

    def detach(self) -> None:
        with self.lock:
            if self.follower is not None:
                self.follower.stop()
            self.follower, self.token = None, None
            if self.server is not None:
                self.server.stop()
                self.server = None

    def is_teacher(self, token: str | None) -> bool:
        """A browser may control the server and change it: it holds the teacher token (or nobody has
        set a server up yet). A room attached without a token learns it from the first browser whose
        token the server accepts."""
        if self.follower is None:
            return True
        return bool(token) and self.token is not None and secrets.compare_digest(token, self.token)


@st.cache_resource(show_spinner=False)
def classroom() -> Classroom:
    return Classroom()


def page() -> None:
    lang = st.session_state["lang"]
    room = classroom()
    st.title(t("page_classroom", lang))
    st.caption(t("classroom_intro", lang))
    live.layout_choice(lang)
    connection(room, lang)
    if room.follower is None:
        st.info(t("not_attached", lang))
        return
    join_panel(lang)
    st.fragment(run_every=DRAW_EVERY_S)(lab_view)()


# ---- the server ------------------------------------------------------------------------------------


def connection(room: Classroom, lang: str) -> None:
    token = st.session_state.get("lab_token")
    teacher = room.is_teacher(token)
    with st.expander(t("classroom_server", lang), expanded=room.follower is None, icon=":material/dns:"):
        if room.follower is not None:
            st.caption(t("attached_to", lang, url=plain(room.url)))
        if not teacher:
            st.caption(t("change_needs_token", lang))
            st.text_input(t("teacher_token", lang), type="password", key="lab_token_entry", help=t("teacher_token_help", lang),
                          on_change=_token_entered, args=(room,))
            if st.session_state.get("lab_token_error"):
                st.error(t("token_refused", lang, error=plain(st.session_state["lab_token_error"])))
            return
        if room.follower is not None:
            if st.button(t("detach", lang), key="btn_lab_detach"):
                room.detach()
                st.rerun()
            return
        source = st.radio(t("classroom_server", lang), ("attach", "start"), horizontal=True, key="lab_source",
                          format_func=lambda s: t(f"classroom_{s}", lang), label_visibility="collapsed")
        if source == "attach":
            url = st.text_input(t("classroom_url", lang), DEFAULT_URL, key="lab_url", help=t("classroom_url_help", lang)).strip()
            typed = st.text_input(t("teacher_token", lang), type="password", key="lab_token_typed", help=t("teacher_token_help", lang))
            read_key = st.text_input(t("classroom_api_key", lang), type="password", key="lab_read_key")
            if st.button(t("attach", lang), type="primary", key="btn_lab_attach"):
                if typed:  # a wrong token is said now, not at the first Step
                    answer = control(url, typed, "status")
                    if "error" in answer and answer.get("status") in (401, 403):
                        st.error(t("token_refused", lang, error=plain(answer["error"])))
                        return
                room.attach(url, read_key, typed or None)
                st.session_state["lab_token"] = typed or None
                st.rerun()
        else:
            st.caption(t("start_server_help", lang))
            port = int(st.number_input(t("server_port", lang), 1024, 65535, 8000, key="lab_port"))
            temperature = st.selectbox(t("room_sampling", lang), ROOM_TEMPERATURES, key="lab_temperature",
                                       help=t("room_sampling_help", lang), format_func=lambda x: t(
                                           "room_sampling_choice_t", lang, temperature=x) if x else t("room_sampling_choice", lang))
            if st.button(t("start_server", lang), type="primary", key="btn_lab_start"):
                start_here(room, port, lang, temperature)


def _token_entered(room: Classroom) -> None:
    """A token typed on an attached page: the server says whether it is the teacher's; if so the
    browser that typed it holds it (and the room learns it, when it was attached without one)."""
    typed = (st.session_state.get("lab_token_entry") or "").strip()
    st.session_state["lab_token_error"] = None
    if not typed or room.follower is None:
        return
    answer = control(room.url, typed, "status")
    if "error" in answer:
        st.session_state["lab_token_error"] = answer["error"]
        return
    with room.lock:
        if room.token is None:
            room.token = typed
    st.session_state["lab_token"] = typed


def start_here(room: Classroom, port: int, lang: str, temperature: float = 0.0) -> None:
    token = secrets.token_urlsafe(12)
    flags = [*engine_flags(st.session_state["settings"]), "--default-temperature", f"{temperature:g}"]
    server = start_server(port, token, flags)
    with st.spinner(t("server_starting", lang)):
        ready = wait_ready(server)
    if not ready:
        server.stop()
        st.error(t("server_failed", lang, log=plain(server.log_tail(600))))
        return
    room.attach(server.url, None, token)
    room.server = server
    st.session_state["lab_token"] = token
    st.rerun()


def engine_flags(settings) -> list[str]:
    """``python -m engine serve`` flags for the sidebar's :class:`~app_pages.state.Settings`."""
    from engine.model_executor.model_loader import DEFAULT_MODEL

    flags = ["--block-size", str(settings.block_size), "--max-num-seqs", str(settings.max_num_seqs),
             "--preemption-mode", settings.preemption_mode, "--allocator", settings.allocator, "--seed", str(settings.seed),
             "--attention-backend", settings.attention_backend]
    if settings.allocator == "contiguous":
        flags += ["--reservation", settings.reservation]
    if settings.model != DEFAULT_MODEL:
        flags += ["--model", settings.model]
    if settings.num_gpu_blocks is not None:
        flags += ["--num-gpu-blocks-override", str(settings.num_gpu_blocks)]
    elif settings.kv_cache_memory is not None:
        flags += ["--kv-cache-memory-bytes", str(settings.kv_cache_memory)]
    if settings.enable_prefix_caching is not None:
        flags.append("--enable-prefix-caching" if settings.enable_prefix_caching else "--no-enable-prefix-caching")
    if settings.enable_chunked_prefill:
        flags.append("--enable-chunked-prefill")
    if settings.max_num_batched_tokens:
        flags += ["--max-num-batched-tokens", str(settings.max_num_batched_tokens)]
    return flags


# ---- joining -----------------------------------------------------------------------------------------


def join_url() -> str:
    """This app's Send page as the students reach it: the address the browser used, with a LAN address
    instead of localhost (a teacher's laptop opens its own app on 127.0.0.1)."""
    try:
        parts = urlsplit(st.context.url or "")
    except Exception:  # noqa: BLE001 - no browser context (a script run): a plain default
        parts = urlsplit("")
    host, port = parts.hostname or "localhost", parts.port or st.get_option("server.port")
    if host in ("localhost", "127.0.0.1", "::1"):
        host = lan_address() or host
    return urlunsplit((parts.scheme or "http", f"{host}:{port}", "/send", "", ""))


def lan_address() -> str | None:
    """This machine's address on its local network (the interface a packet out would leave by), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # UDP: nothing is sent
            return s.getsockname()[0]
        except OSError:
            return None


def join_panel(lang: str) -> None:
    """The address to join and its QR code: large on the projector, folded otherwise."""
    st.session_state.setdefault("join_url", join_url())
    box = st.container(border=True) if live.projector() else st.expander(t("join_title", lang), icon=":material/qr_code:")
    with box:
        left, right = st.columns([1, 2])
        with right:
            st.markdown(f"### {t('join_title', lang)}")
            address = st.text_input(t("join_address", lang), key="join_url", help=t("join_address_help", lang)).strip()
            st.markdown(f'<div data-testid="join-address" style="font-size:1.6rem;font-weight:600">{html_text(address)}</div>',
                        unsafe_allow_html=True)
            st.caption(t("join_caption", lang))
        with left:
            try:
                svg = base64.b64encode(qr_svg(address).encode()).decode()
            except ValueError:  # an empty or too long address: no code
                return
            st.markdown(f'<div data-testid="join-qr"><img alt="{html_text(address)}" style="width:100%;max-width:280px" '
                        f'src="data:image/svg+xml;base64,{svg}"></div>', unsafe_allow_html=True)


# ---- the live view -----------------------------------------------------------------------------------


def lab_view() -> None:
    lang = st.session_state["lang"]
    room = classroom()
    follower = room.follower
    if follower is None:
        return
    token = st.session_state.get("lab_token")
    newest = None
    if token and room.is_teacher(token):
        newest = teacher_controls(follower.url, token, lang)
    if newest is not None:  # the Step just taken: draw it, not the step before (the stream brings it in a moment)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not (follower.reports and follower.reports[-1].step >= newest):
            time.sleep(0.05)
    reports, requests, engine, mode = follower.view()
    mode_line(mode, lang)
    sampling_line(follower.sampling, lang)
    if follower.error and not follower.connected:
        st.warning(t("lab_stream_error", lang, error=plain(follower.error)))
    if not reports or not engine:
        st.info(t("lab_no_steps", lang, n=len(requests)))
        return
    prompts = {rid: info["prompt"] for rid, info in requests.items()}
    for report in reports:  # a request the stream has not named yet still gets a row
        for snap in report.block_tables:
            prompts.setdefault(snap.request_id, "")
    labels = {rid: info["client"] for rid, info in requests.items() if info.get("client")}
    live.show_step(prompts, reports, engine["block_size"], lang, labels=labels)
    save_session(follower, lang)


def mode_line(mode: dict, lang: str) -> None:
    if not mode:
        return
    if mode.get("mode") == "step":
        st.caption(t("mode_step", lang))
    else:
        rate = mode.get("max_steps_per_s")
        st.caption(t("mode_run", lang, speed=t("speed_per_s", lang, n=rate) if rate else t("speed_full", lang)))


def sampling_line(sampling: dict, lang: str) -> None:
    """How the room's answers are sampled (the server's default temperature), on the page and the projector."""
    if not sampling or sampling.get("temperature") is None:
        return
    temperature = sampling["temperature"]
    st.caption(t("room_sampling_temperature", lang, temperature=temperature) if temperature else t("room_sampling_greedy", lang))


def teacher_controls(url: str, token: str, lang: str) -> int | None:
    """Step / Pause / Run and the run speed; returns the step a Step just ran (None otherwise)."""
    c = st.columns([1, 1, 1, 2])
    stepped = c[0].button(t("step", lang), type="primary", width="stretch", key="btn_lab_step")
    paused = c[1].button(t("pause", lang), width="stretch", key="btn_lab_pause")
    run = c[2].button(t("lab_run", lang), width="stretch", key="btn_lab_run")
    speed = c[3].select_slider(t("lab_speed", lang), SPEEDS, value=SPEEDS[0], key="lab_speed",
                               format_func=lambda s: t("speed_per_s", lang, n=s) if s else t("speed_full", lang))
    answer = None
    if stepped:
        answer = control(url, token, "step")
    elif paused:
        answer = control(url, token, "pause")
    elif run:
        answer = control(url, token, "run", speed or None)
    if answer is None:
        return None
    if "error" in answer:
        st.error(t("token_refused", lang, error=plain(answer["error"])))
        return None
    if stepped and not answer.get("stepped"):
        st.info(t("lab_nothing_to_step", lang))
    return answer.get("step") if stepped else None


def save_session(follower: Follower, lang: str) -> None:
    """The server's session as a run file, fetched when clicked."""

    def fetch() -> bytes:
        response = httpx.get(f"{follower.url}/lab/session", headers=follower.headers, timeout=60)
        return response.content if response.status_code == 200 else b""

    st.download_button(t("save_session", lang), fetch, file_name="classroom_session.json", mime="application/json",
                       key="dl_lab_session", help=t("save_session_help", lang))
