"""The app's side of the classroom: a server the app started or attached to, and a follower of its
step stream (the lab endpoints, engine/entrypoints/lab.py).

One :class:`Link` per app process (``st.cache_resource`` in app_pages/classroom.py): every browser
session, the teacher's projector and each student's phone, draws from the same follower, which
reads the server's ``/lab/steps`` on a thread of its own, once.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from engine.report import StepReport
from engine.runfile import from_json, load_run
from engine.user_cache import cache_dir

ROOT = Path(__file__).resolve().parent.parent
MAX_STEPS_KEPT = 2000  # as the Live page and the server keep
RECONNECT_S = 1.0
MAX_LABEL_CHARS = 40  # a client's label as the pages show it
SPEEDS = (0.0, 4.0, 2.0, 1.0, 0.5)  # run mode's choices, steps a second (0: full speed)


@dataclass
class Follower:
    """Follows one server's step stream; the newest :data:`MAX_STEPS_KEPT` steps, the requests'
    labels and prompts, the mode. On a cut (the server went away, or this follower lagged) it
    reconnects and fills the gap from ``/lab/session``. A server restarted on the same address has
    another ``server_id`` in its ``hello``: the old server's requests and steps are dropped then
    (the new one reuses their ids and step numbers) and ``restarted`` is set.

    Attributes:
        url: the server's base URL ("http://127.0.0.1:8000").
        read_key: a key for the read endpoints (a server with API keys), else None.
    """

    url: str
    read_key: str | None = None
    reports: list = field(default_factory=list)
    requests: dict = field(default_factory=dict)  # request id -> {"client", "prompt", "max_tokens"}
    engine: dict = field(default_factory=dict)  # the run file's engine object
    settings: dict = field(default_factory=dict)  # the run file's settings object: the server's engine settings
    mode: dict = field(default_factory=dict)
    sampling: dict = field(default_factory=dict)  # the room's: {"temperature"} of a request that sets none
    error: str | None = None
    connected: bool = False
    server_id: str | None = None  # the hello's: which start of the server this follower's data is from
    restarted: bool = False  # the server restarted while this follower followed it

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._response: httpx.Response | None = None
        self._thread = threading.Thread(target=self._follow, name=f"lab-follower {self.url}", daemon=True)
        self._thread.start()

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.read_key}"} if self.read_key else {}

    def view(self) -> tuple[list, dict, dict, dict]:
        """(reports, requests, engine, mode), copies safe to draw from."""
        with self._lock:
            return list(self.reports), dict(self.requests), dict(self.engine), dict(self.mode)

    def stop(self) -> None:
        """Stop following: the stream is closed now, not at its next event."""
        self._stop.set()
        response = self._response
        if response is not None:
            try:
                response.close()
            except Exception:  # noqa: BLE001 - closing from another thread may race the reader; it stops either way
                pass

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:
                self._read_stream()
            except (httpx.HTTPError, ValueError, KeyError, RuntimeError) as error:
                if not self._stop.is_set():
                    self.error = f"{type(error).__name__}: {error}"
            self._response = None
            self.connected = False
            self._stop.wait(RECONNECT_S)

    def _read_stream(self) -> None:
        timeout = httpx.Timeout(10, read=60)  # the server sends a keepalive every 15 s
        with httpx.stream("GET", f"{self.url}/lab/steps", headers=self.headers, timeout=timeout) as response:
            self._response = response
            if response.status_code != 200:
                response.read()
                raise ValueError(f"{response.status_code} {_message(response)}")
            event = None
            for line in response.iter_lines():
                if self._stop.is_set():
                    return
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    self._on(event, json.loads(line[6:]))

    def _on(self, event: str | None, data: dict) -> None:
        if event == "hello":
            with self._lock:
                server_id = data.get("server_id")
                if self.server_id is not None and server_id != self.server_id:  # a new server: start over
                    self.requests, self.reports, self.restarted = {}, [], True
                self.server_id = server_id
                self.engine, self.settings, self.mode = data["engine"], data.get("settings") or {}, data["mode"]
                self.sampling = data.get("sampling") or {}
                self.requests.update({int(k): v for k, v in data["requests"].items()})
            self._catch_up(data["next_step"])
            self.connected, self.error = True, None
        elif event == "request":
            with self._lock:
                self.requests[data["request_id"]] = {k: data[k] for k in ("client", "prompt", "max_tokens")}
        elif event == "step":
            report = from_json(StepReport, data)
            with self._lock:
                if self.reports and report.step != self.reports[-1].step + 1:
                    self.reports = []  # a new server on the same address: start over
                self.reports.append(report)
                del self.reports[:-MAX_STEPS_KEPT]
        elif event == "mode":
            with self._lock:
                self.mode = data
        elif event == "lagged":
            self.error = f"fell behind the server at step {data['missed_from_step']}: reconnecting"

    def _catch_up(self, next_step: int) -> None:
        """The steps before ``next_step`` this follower lacks, from the server's saved session."""
        have = self.reports[-1].step + 1 if self.reports else 0
        if next_step == 0 or have == next_step:
            if next_step == 0:
                with self._lock:
                    self.reports = []
            return
        response = httpx.get(f"{self.url}/lab/session", headers=self.headers, timeout=60)
        if response.status_code != 200:
            return
        run = load_run(response.content, name="the server's session")
        with self._lock:
            self.reports = [r for r in run.steps if r.step < next_step][-MAX_STEPS_KEPT:]
            clients = json.loads(response.content).get("clients", {})
            for rid, prompt in run.prompts.items():
                self.requests.setdefault(rid, {"client": clients.get(str(rid), ""), "prompt": prompt, "max_tokens": 0})


def session_clients(raw: bytes) -> dict[int, str]:
    """A classroom session's ``clients`` (request id -> the client's label) from a run file's bytes;
    empty for any other run file, or where the object is not ids to short strings."""
    try:
        clients = json.loads(raw).get("clients")
    except (ValueError, AttributeError, RecursionError):
        return {}
    if not isinstance(clients, dict):
        return {}
    return {int(k): v[:MAX_LABEL_CHARS] for k, v in clients.items()
            if isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 18 and isinstance(v, str) and v}


def _message(response: httpx.Response) -> str:
    try:
        return response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response.text[:200]


def control(url: str, token: str, action: str, max_steps_per_s: float | None = None, for_address: str | None = None) -> dict:
    """``POST /lab/control``: the server's answer, or ``{"error": message}`` (a bad token: 401/403).

    ``for_address``: the browser that typed ``token``, when it is not on this machine. The server counts
    wrong tokens per address and answers 429 past its limit (engine/entrypoints/auth.py); the app reaches
    it from 127.0.0.1, so without this a student's guesses would lock the teacher's own controls. It goes
    as ``X-Forwarded-For``, which uvicorn believes from 127.0.0.1 only (its ``forwarded_allow_ips``)."""
    body = {"action": action, **({"max_steps_per_s": max_steps_per_s} if action == "run" else {})}
    headers = {"Authorization": f"Bearer {token}", **({"X-Forwarded-For": for_address} if for_address else {})}
    try:
        response = httpx.post(f"{url}/lab/control", json=body, headers=headers, timeout=120)
    except httpx.HTTPError as error:
        return {"error": f"{type(error).__name__}: {error}"}
    if response.status_code != 200:
        return {"error": f"{response.status_code}: {_message(response)}", "status": response.status_code}
    return response.json()


@dataclass
class ServerProcess:
    """``python -m engine serve`` started by the app (on 127.0.0.1: the app's pages talk to it; the
    students reach the app, not the server)."""

    port: int
    token: str
    process: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def start_server(port: int, token: str, flags: list[str], log_dir: Path | None = None) -> ServerProcess:
    """Start ``python -m engine serve`` on 127.0.0.1:``port`` with ``flags`` (engine flags) in step mode.
    Its log goes to ``log_dir``, by default the user cache's ``classroom/`` (never the checkout)."""
    log_dir = log_dir if log_dir is not None else cache_dir() / "classroom"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"classroom_server_{port}.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    command = [sys.executable, "-m", "engine", "serve", "--host", "127.0.0.1", "--port", str(port),
               f"--teacher-token={token}", "--lab-mode", "step", "--uvicorn-log-level", "warning", *flags]
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    server = ServerProcess(port, token, process, log)
    atexit.register(server.stop)  # the app's exit (Ctrl-C, SIGTERM) stops the server it started: none outlives it
    return server


def wait_ready(server: ServerProcess, timeout_s: float = 300) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and server.alive():
        if server.ready():
            return True
        time.sleep(0.3)
    return False
