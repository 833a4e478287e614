"""Classroom page: the app attached to an engine server (``python -m engine serve``) that the whole
class sends requests to. Every step of the shared engine is drawn with the Live page's functions,
each request labelled by its client; the address to join is shown with its QR code; the teacher's
browser has Step / Pause / Run controls (the server's lab endpoints, engine/entrypoints/lab.py).

Who is the teacher: a browser on the machine that runs the app (a loopback connection), or one that
typed the app's teacher token (printed in the terminal that started the app, and shown to the
teacher's browsers), which then keeps it in a cookie across reloads. Only the teacher attaches,
starts, detaches or stops a server; everyone else sees the view.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import secrets
import socket
import sys
import threading
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import streamlit as st

from app_pages import live
from app_pages.classroom_link import SPEEDS, Follower, ServerProcess, control, start_server, wait_ready
from app_pages.common import html_text, plain
from visualize.classroom import qr_svg
from visualize.i18n import CATALOGUE, t

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "http://127.0.0.1:8000"
DRAW_EVERY_S = 1.0  # the view's refresh while attached
ROOM_TEMPERATURES = (0.0, 0.7, 1.0)  # the room's sampling a started server may get (0: greedy)
TEACHER_COOKIE = "pagedattention_lab_teacher"  # a browser that typed the teacher token keeps it here
TEACHER_COOKIE_S = 24 * 3600  # a class day


class Classroom:
    """The app process's one classroom: the server it follows (and the one it started, if any).
    Shared by every browser session, the teacher's and the students'.

    ``key`` is the app's teacher token, made once per app process and printed in its terminal: a
    browser that types it is the teacher; a server started here takes it as its ``--teacher-token``.
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.follower: Follower | None = None
        self.server: ServerProcess | None = None
        self.token: str | None = None  # the attached server's teacher token, once known
        self.key = secrets.token_urlsafe(12)
        print(f"PagedAttention Lab classroom: teacher token {self.key} (type it on the Classroom page of a browser on "
              "another machine to control the class from there; a browser on this machine needs none)",
              file=sys.stderr, flush=True)

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
        """Stop following the server; a server started here keeps running (attach again, or stop it)."""
        with self.lock:
            if self.follower is not None:
                self.follower.stop()
            self.follower, self.token = None, None

    def stop_server(self) -> None:
        """Stop the server started here (detaching first when it is the one followed)."""
        server = self.server
        if server is None:
            return
        if self.follower is not None and self.follower.url == server.url:
            self.detach()
        server.stop()
        self.server = None

    def close(self) -> None:
        self.detach()
        self.stop_server()

    def proves(self, secret: str | None) -> bool:
        """``secret`` is the app's teacher token or the attached server's."""
        if not secret:
            return False
        return any(known is not None and secrets.compare_digest(secret, known) for known in (self.key, self.token))

    def is_teacher(self, secret: str | None, local: bool) -> bool:
        """A browser may attach, start, detach or stop a server and step it: it runs on this machine
        (``local``) or holds a teacher token (:meth:`proves`)."""
        return local or self.proves(secret)


@st.cache_resource(show_spinner=False)
def classroom() -> Classroom:
    return Classroom()


def local_browser() -> bool:
    """This browser runs on the app's machine: its connection comes from a loopback address.

    Streamlit reports the connection's TCP peer (``st.context.ip_address``: None for 127.0.0.1 and
    ::1; no address at all in a script run without a browser, AppTest's, which runs on this machine);
    uvicorn trusts forwarding headers from 127.0.0.1 only, so another machine cannot pose as this one.
    A reverse proxy on this machine would make every browser local: serve the class directly.
    """
    ip = st.context.ip_address
    if not isinstance(ip, str):  # None: 127.0.0.1 or ::1; not a string: AppTest's stand-in for a connection
        return True
    try:
        address = ipaddress.ip_address(ip.split("%")[0])
    except ValueError:
        return False
    address = getattr(address, "ipv4_mapped", None) or address
    return address.is_loopback


def browser_address() -> str | None:
    """This browser's address, for the server to count what it sends as its own (per-address caps and
    wrong guesses) rather than the app's 127.0.0.1; None for a browser on this machine."""
    ip = st.context.ip_address
    return None if local_browser() or not isinstance(ip, str) else ip


def held_token() -> str | None:
    """The teacher token this browser holds: typed on this page since it was opened, or kept in its cookie."""
    return st.session_state.get("lab_token") or kept_token()


def kept_token() -> str | None:
    """The teacher token in this browser's cookie (sent with the page's connection), else None."""
    value = st.context.cookies.get(TEACHER_COOKIE)
    return value if isinstance(value, str) else None  # (a script run without a browser has no cookies)


def teacher(room: Classroom) -> bool:
    return room.is_teacher(held_token(), local_browser())


def keep_token(room: Classroom) -> None:
    """A browser on another machine that proved itself keeps the app's teacher token in a cookie (this
    browser only, this site only), so that a reload or a new tab is still the teacher's."""
    if local_browser() or not room.proves(held_token()) or kept_token() == room.key:
        return
    cookie = f"{TEACHER_COOKIE}={room.key}; path=/; max-age={TEACHER_COOKIE_S}; SameSite=Strict"
    st.html(f"<script>document.cookie = {json.dumps(cookie)};</script>", unsafe_allow_javascript=True)


def page() -> None:
    lang = st.session_state["lang"]
    room = classroom()
    st.title(t("page_classroom", lang))
    st.caption(t("classroom_intro", lang))
    live.layout_choice(lang)
    keep_token(room)
    connection(room, lang)
    if room.follower is None:
        st.info(t("not_attached", lang))
        return
    join_panel(lang)
    st.fragment(run_every=DRAW_EVERY_S)(lab_view)()


def server_sidebar(room: Classroom, lang: str) -> None:
    """The attached server's engine, in the sidebar (its session's settings, not this browser's)."""
    follower = room.follower
    if follower is None:
        return
    deadline = time.monotonic() + 5  # just attached: the stream's hello brings them in a moment (the sidebar
    while not follower.settings and follower.error is None and time.monotonic() < deadline:  # is not redrawn every second)
        time.sleep(0.05)
    _, _, engine, _ = follower.view()
    settings = follower.settings
    sb = st.sidebar
    sb.header(t("server_engine", lang))
    if not engine or not settings:
        sb.caption(t("server_engine_waiting", lang))
        return
    sb.caption(t("server_engine_help", lang))
    def yes_no(value) -> str:
        return t("yes" if value else "no", lang)

    def choice(key: str, value) -> str:  # a run file's choice, in words where the catalogue has them
        return t(f"{key}_{value}", lang) if f"{key}_{value}" in CATALOGUE else value

    allocator, prefix = settings.get("allocator", "paged"), settings.get("enable_prefix_caching")
    rows = [
        (t("model", lang), engine.get("model_name")),
        (t("block_size", lang), engine.get("block_size")),
        (t("pool_blocks", lang), engine.get("num_blocks")),
        (t("allocator", lang), choice("allocator", allocator)),
        (t("prefix_caching", lang), yes_no(allocator == "paged" if prefix is None else prefix)),
        (t("backend", lang), settings.get("attention_backend")),
        (t("max_batch", lang), settings.get("max_num_seqs")),
        (t("preemption_mode", lang), choice("preemption", settings.get("preemption_mode", "recompute"))),
        (t("chunked_prefill", lang), yes_no(settings.get("enable_chunked_prefill"))),
    ]
    if settings.get("enable_chunked_prefill") and settings.get("max_num_batched_tokens"):
        rows.append((t("token_budget", lang), settings["max_num_batched_tokens"]))
    sb.markdown("\n".join(f"- {label}{t('sep_colon', lang)}**{plain(value)}**" for label, value in rows))  # values: the server's text


# ---- the server ------------------------------------------------------------------------------------


def connection(room: Classroom, lang: str) -> None:
    is_teacher = teacher(room)
    with st.expander(t("classroom_server", lang), expanded=room.follower is None, icon=":material/dns:"):
        if room.follower is not None:
            st.caption(t("attached_to", lang, url=plain(room.url)))
        if not is_teacher:
            st.caption(t("change_needs_token", lang) if room.follower is not None else t("teacher_only", lang))
            token_entry(room, lang)
            return
        teacher_token_panel(room, lang)
        if room.follower is not None:
            c = st.columns([1, 1, 3])
            if c[0].button(t("detach", lang), key="btn_lab_detach"):
                room.detach()
                st.rerun()
            if room.server is not None and c[1].button(t("stop_server", lang), key="btn_lab_stop"):
                room.stop_server()
                st.rerun()
            if room.token is None:  # attached without the server's token: the view until it is typed
                token_entry(room, lang)
            return
        if room.server is not None and room.server.alive():  # detached from the server started here
            st.caption(t("server_still_running", lang, url=plain(room.server.url)))
            c = st.columns([1, 1, 3])
            if c[0].button(t("attach_again", lang), key="btn_lab_reattach"):
                room.attach(room.server.url, None, room.server.token)
                st.rerun()
            if c[1].button(t("stop_server", lang), key="btn_lab_stop"):
                room.stop_server()
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
                st.rerun()
        else:
            st.caption(t("start_server_help", lang))
            port = int(st.number_input(t("server_port", lang), 1024, 65535, 8000, key="lab_port"))
            temperature = st.selectbox(t("room_sampling", lang), ROOM_TEMPERATURES, key="lab_temperature",
                                       help=t("room_sampling_help", lang), format_func=lambda x: t(
                                           "room_sampling_choice_t", lang, temperature=x) if x else t("room_sampling_choice", lang))
            if st.button(t("start_server", lang), type="primary", key="btn_lab_start"):
                start_here(room, port, lang, temperature)


def teacher_token_panel(room: Classroom, lang: str) -> None:
    """The app's teacher token, folded (the page may be on the projector): typed in another browser,
    the projector PC's say, it makes that browser the teacher's."""
    with st.expander(t("teacher_token_here", lang), icon=":material/key:"):
        st.caption(t("teacher_token_here_help", lang))
        st.code(room.key, language=None)


def token_entry(room: Classroom, lang: str) -> None:
    st.text_input(t("teacher_token", lang), type="password", key="lab_token_entry", help=t("teacher_token_help", lang),
                  on_change=_token_entered, args=(room,))
    if st.session_state.get("lab_token_error"):
        st.error(t("token_entry_refused", lang, error=plain(st.session_state["lab_token_error"])))


def _token_entered(room: Classroom) -> None:
    """A token typed on the page: the app's teacher token or the attached server's makes this browser
    the teacher's; a server attached without its token learns it from the first browser whose token
    the server accepts."""
    typed = (st.session_state.get("lab_token_entry") or "").strip()
    st.session_state["lab_token_error"] = None
    if not typed:
        return
    if room.proves(typed):
        st.session_state["lab_token"] = typed
        return
    if room.follower is None or room.token is not None:
        st.session_state["lab_token_error"] = t("token_not_teacher", st.session_state["lang"])
        return
    answer = control(room.url, typed, "status", for_address=browser_address())
    if "error" in answer:
        st.session_state["lab_token_error"] = answer["error"]
        return
    with room.lock:
        if room.token is None:
            room.token = typed
    st.session_state["lab_token"] = typed


def start_here(room: Classroom, port: int, lang: str, temperature: float = 0.0) -> None:
    room.stop_server()  # one server started here at a time
    flags = [*engine_flags(st.session_state["settings"]), "--default-temperature", f"{temperature:g}"]
    server = start_server(port, room.key, flags)
    with st.spinner(t("server_starting", lang)):
        ready = wait_ready(server)
    if not ready:
        server.stop()
        st.error(t("server_failed", lang, log=plain(server.log_tail(600))))
        return
    room.attach(server.url, None, room.key)
    room.server = server
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


def join_url(lang: str) -> str:
    """This app's Send page as the students reach it: the address the browser used, with a LAN address
    instead of localhost (a teacher's laptop opens its own app on 127.0.0.1), in student mode and in
    the class's language (:func:`link_for_class`)."""
    try:
        parts = urlsplit(st.context.url or "")
    except Exception:  # noqa: BLE001 - no browser context (a script run): a plain default
        parts = urlsplit("")
    host, port = parts.hostname or "localhost", parts.port or st.get_option("server.port")
    if host in ("localhost", "127.0.0.1", "::1"):
        host = lan_address() or host
    return link_for_class(urlunsplit((parts.scheme or "http", f"{host}:{port}", "/send", "", "")), lang)


def link_for_class(address: str, lang: str) -> str:
    """``address`` with ``mode=student`` (only the Send page) and ``lang`` (the page's language) in its
    query, its other parts as they are (a teacher may have corrected the host)."""
    parts = urlsplit(address)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k not in ("mode", "lang")]
    query += [("mode", "student"), ("lang", lang)]
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


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
    state = st.session_state
    # Before the box is drawn: the link follows the page's language, whatever else the teacher corrected in it.
    state["join_url"] = link_for_class(state["join_url"], lang) if state.get("join_url") else join_url(lang)
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
    token = room.token
    newest = None
    if token and teacher(room):
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
        if follower.restarted:
            st.info(t("lab_server_restarted", lang))
        st.info(t("lab_no_steps", lang, n=len(requests)))
        return
    prompts = {rid: info["prompt"] for rid, info in requests.items()}
    for report in reports:  # a request the stream has not named yet still gets a row
        for snap in report.block_tables:
            prompts.setdefault(snap.request_id, "")
    labels = {rid: info["client"] for rid, info in requests.items() if info.get("client")}
    live.show_step(prompts, reports, engine["block_size"], lang, labels=labels, fold_finished=True)
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
