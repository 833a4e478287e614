"""The classroom's lab endpoints (/lab/steps, /lab/control, /lab/snapshot, /lab/session) on a real
server, followed by real HTTP clients (httpx's streaming reader, the `openai` client).

One server per module over a tiny random model, started in step mode with a known teacher token.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time

import httpx
import openai
import pytest

from engine import EngineConfig, LLMEngine
from engine.entrypoints.lab import StepHub
from engine.entrypoints.openai.api_server import ServerSettings
from engine.runfile import load_run
from tests.serving import serving, wait_until, wait_until_healthy

TEACHER = "teacher-secret-token"
TEACHER_HEADERS = {"Authorization": f"Bearer {TEACHER}"}


class Viewer:
    """A viewer of /lab/steps on a thread of its own: every event it got, parsed, in order."""

    def __init__(self, base: str, headers: dict | None = None):
        self.events: list[tuple[str, dict]] = []
        self.closed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(base, headers or {}), daemon=True)
        self._thread.start()
        wait_until(lambda: self.events and self.events[0][0] == "hello", what="the viewer's hello")

    def _read(self, base: str, headers: dict) -> None:
        try:
            with httpx.stream("GET", f"{base}/lab/steps", headers=headers, timeout=httpx.Timeout(60, read=None)) as response:
                assert response.status_code == 200
                event = None
                for line in response.iter_lines():
                    if self._stop.is_set():
                        return
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: "):
                        self.events.append((event, json.loads(line[6:])))
        except httpx.TransportError:  # the server stopped while this viewer still followed
            pass
        finally:
            self.closed.set()

    def steps(self) -> list[int]:
        return [data["step"] for kind, data in self.events if kind == "step"]

    def close(self) -> None:
        self._stop.set()


def control(base: str, **body) -> dict:
    response = httpx.post(f"{base}/lab/control", json=body, headers=TEACHER_HEADERS, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def server(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=32, block_size=4))
    settings = ServerSettings(teacher_token=TEACHER, lab_mode="step")
    with serving(engine, settings) as (base, app):
        yield base, app, engine


def test_step_mode_one_step_per_call_every_viewer_every_step_labelled_by_user(server):
    base, app, engine = server
    first, second = Viewer(base), Viewer(base)
    hello = first.events[0][1]
    assert hello["format"] == "pagedattention-lab/run" and hello["mode"]["mode"] == "step"
    assert hello["engine"]["num_blocks"] == 32 and hello["engine"]["block_size"] == 4

    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
    answer: dict = {}

    def ask() -> None:
        stream = client.chat.completions.create(model=engine.model_name, messages=[{"role": "user", "content": "Name three fruits."}],
                                                max_tokens=5, temperature=0, user="alice", stream=True, extra_body={"ignore_eos": True})
        answer["text"] = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    # The request is labelled by its `user` in the stream within a few seconds, before any step runs.
    wait_until(lambda: any(k == "request" and d["client"] == "alice" for k, d in second.events), timeout=5, what="alice's request")
    request_id = next(d["request_id"] for k, d in second.events if k == "request" and d["client"] == "alice")
    assert next(d["prompt"] for k, d in second.events if k == "request") == "Name three fruits."
    time.sleep(0.5)
    assert first.steps() == [] and second.steps() == [], "step mode stepped without a Step"

    stepped = []
    while "text" not in answer:
        before = len(first.steps()), len(second.steps())
        reply = control(base, action="step")
        if not reply["stepped"]:
            break
        stepped.append(reply["step"])
        # Exactly one step per call, to every viewer.
        wait_until(lambda: len(first.steps()) == before[0] + 1 and len(second.steps()) == before[1] + 1, what="the step's event")
        time.sleep(0.05)
        assert (len(first.steps()), len(second.steps())) == (before[0] + 1, before[1] + 1)
        assert len(stepped) <= 10, "the request did not finish in 10 steps"
        if len(stepped) == 5:  # prefill + 4 decodes give 5 tokens: its stream ends now
            asker.join(10)
    asker.join(10)
    assert not asker.is_alive() and answer["text"]
    assert stepped == list(range(stepped[0], stepped[0] + len(stepped))) and len(stepped) == 5
    assert first.steps() == second.steps() == stepped
    step_events = [d for k, d in first.events if k == "step"]
    assert any(t["request_id"] == request_id for t in step_events[0]["block_tables"]), "the request holds no block after its prefill"
    assert step_events[-1]["finished"] == {str(request_id): "length"}
    # Nothing to step: the call says so and steps nothing.
    reply = control(base, action="step")
    assert reply["stepped"] is False and reply["next_step"] == stepped[-1] + 1
    first.close(), second.close()


def test_bad_teacher_token_and_bad_control_are_refused(server):
    base, _, _ = server
    url = f"{base}/lab/control"
    missing = httpx.post(url, json={"action": "step"})
    assert missing.status_code == 401 and missing.json()["error"]["param"] == "authorization"
    wrong = httpx.post(url, json={"action": "step"}, headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 403 and "teacher token" in wrong.json()["error"]["message"]
    bad = httpx.post(url, json={"action": "jump"}, headers=TEACHER_HEADERS)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "action"
    bad = httpx.post(url, json={"action": "run", "max_steps_per_s": -2}, headers=TEACHER_HEADERS)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_steps_per_s"
    bad = httpx.post(url, json={"action": "step", "speed": 2}, headers=TEACHER_HEADERS)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "speed"
    assert httpx.get(url).json()["mode"] == "step", "a refused call changed the mode"


def test_run_mode_runs_freely_and_a_dropped_viewer_does_not_stall_it(server):
    base, app, engine = server
    stays = Viewer(base)
    with httpx.stream("GET", f"{base}/lab/steps", timeout=30) as response:  # a viewer that reads its hello and goes away
        next(response.iter_lines())
    dropped_at = httpx.get(f"{base}/lab/control").json()
    try:
        assert control(base, action="run", max_steps_per_s=None)["mode"] == "run"
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
        done = client.completions.create(model=engine.model_name, prompt="Once upon a time", max_tokens=12, temperature=0,
                                         user="bob", extra_body={"ignore_eos": True})
        assert done.usage.completion_tokens == 12
        wait_until(lambda: httpx.get(f"{base}/lab/control").json()["num_viewers"] == 1, what="the dropped viewer's removal")
        assert len(stays.steps()) >= 12 and stays.steps() == list(range(stays.steps()[0], stays.steps()[-1] + 1))
        assert any(k == "mode" and d["mode"] == "run" for k, d in stays.events)
        assert dropped_at["num_viewers"] >= 1
        # A speed cap spaces the steps out (5 a second: 0.2 s apart, each step taking a few ms).
        control(base, action="run", max_steps_per_s=5)
        n = len(stays.steps())
        started = time.monotonic()
        client.completions.create(model=engine.model_name, prompt="Hi", max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
        wait_until(lambda: len(stays.steps()) >= n + 4, what="the capped steps")
        assert time.monotonic() - started >= 0.55, "4 steps at 5 a second took less than 3 intervals"
    finally:
        control(base, action="pause")
        stays.close()
    assert httpx.get(f"{base}/lab/control").json()["mode"] == "step"


def test_snapshot_and_saved_session(server):
    base, app, engine = server
    snapshot = httpx.get(f"{base}/lab/snapshot").json()
    assert snapshot["queues"] == {"waiting": [], "running": [], "swapped": []}
    assert {r["client"] for r in snapshot["requests"].values()} >= {"alice", "bob"}
    assert snapshot["step"]["step"] == snapshot["next_step"] - 1 and snapshot["step"]["memory"]["capacity"] == 32 * 4
    response = httpx.get(f"{base}/lab/session")
    assert response.status_code == 200
    run = load_run(response.content, name="classroom_session.json")
    assert [r.step for r in run.steps] == list(range(snapshot["next_step"]))
    assert run.engine["num_blocks"] == 32 and "Name three fruits." in run.prompts.values()
    clients = json.loads(response.content)["clients"]
    assert {clients[str(rid)] for rid, text in run.prompts.items() if text == "Name three fruits."} == {"alice"}


def test_a_slow_viewer_is_cut_off_and_never_stalls_the_hub(server):
    """A viewer that reads nothing: its buffer fills, the hub puts nothing more in it (publishing
    never waits), and the viewer gets what it had, then a `lagged` event naming the first step it missed."""
    base, app, engine = server
    reports = list(app.state.hub.steps)[:6]
    assert len(reports) == 6

    async def scenario():
        hub = StepHub(app.state.hub.engine_info, app.state.hub.settings, viewer_buffer=3)
        events = hub.follow()
        assert (await anext(events)).startswith("event: hello")
        for report in reports:
            hub.publish_step(report)  # synchronous: it cannot wait for the viewer
        got = [await anext(events) for _ in range(4)]
        with pytest.raises(StopAsyncIteration):
            await anext(events)
        return hub, got

    hub, got = asyncio.run(scenario())
    assert [g.split("\n")[0] for g in got] == ["event: step"] * 3 + ["event: lagged"]
    assert json.loads(got[-1].split("data: ", 1)[1])["missed_from_step"] == reports[3].step
    assert hub.num_lagged == 1 and not hub.viewers


def test_api_keys_label_requests_and_guard_the_lab(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=16, block_size=4))
    settings = ServerSettings(api_keys={"key-of-carol": "carol"}, teacher_token=TEACHER)
    with serving(engine, settings) as (base, app):
        assert httpx.get(f"{base}/lab/snapshot").status_code == 401
        assert httpx.get(f"{base}/lab/snapshot", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{base}/lab/snapshot", headers=TEACHER_HEADERS).status_code == 200
        viewer = Viewer(base, {"Authorization": "Bearer key-of-carol"})
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="key-of-carol", max_retries=0, timeout=60)
        client.completions.create(model=engine.model_name, prompt="Hello", max_tokens=2, temperature=0)
        wait_until(lambda: any(k == "request" for k, _ in viewer.events), what="the request event")
        assert [d["client"] for k, d in viewer.events if k == "request"] == ["carol"]
        # The teacher token is not an API key.
        assert httpx.post(f"{base}/v1/completions", json={"prompt": "Hi"}, headers=TEACHER_HEADERS).status_code == 401
        # The Send page sends a student's request with the key the student typed, never the teacher's:
        # it is labelled by that key; without one the server says so in the chat.
        from app_pages.send import _stream

        messages = [{"role": "user", "content": "Hi"}]
        mine, none = ({"role": "assistant", "content": "", "request_id": None, "error": None, "done": False} for _ in range(2))
        _stream(base, "key-of-carol", "Zoe", messages, 2, mine, for_address="10.1.2.3")
        _stream(base, None, "Ben", messages, 2, none, for_address="10.1.2.4")
        assert mine["error"] is None and mine["done"] and none["error"].startswith("401")
        wait_until(lambda: len([k for k, _ in viewer.events if k == "request"]) == 2, what="the Send page's request event")
        assert [d["client"] for k, d in viewer.events if k == "request"] == ["carol", "carol"]
        viewer.close()


def test_classroom_and_send_pages_attached_in_chinese(server, tiny_llama_dir, cpu_kernels_built, monkeypatch):
    """The app (Streamlit's AppTest) attaches to the server by its address and teacher token: the
    Classroom page draws the server's steps with each request's client, in Chinese with no English
    UI text left; the Send page shows the shared pool."""
    from streamlit.testing.v1 import AppTest

    from app_pages import classroom as classroom_page
    from app_pages.classroom import classroom
    from app_pages.classroom_link import session_clients
    from app_pages.state import MODEL_ENV
    from tests.test_app import APP, _open_page, _texts
    from visualize.i18n import untranslated

    base, _, engine = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
    asker = threading.Thread(target=lambda: client.completions.create(model=engine.model_name, prompt="Hello there", max_tokens=3,
                                                                       user="dora", extra_body={"ignore_eos": True}), daemon=True)
    asker.start()
    wait_until(lambda: httpx.get(f"{base}/lab/control").json()["num_requests"] == 1, what="dora's request")
    while control(base, action="step")["stepped"] and asker.is_alive():
        pass
    asker.join(10)
    monkeypatch.setenv(MODEL_ENV, str(tiny_llama_dir))
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.radio(key="lang").set_value("zh").run()
    _open_page(at, "classroom")
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "课堂" and untranslated(_texts(at)) == []
    try:
        at.text_input(key="lab_url").set_value(base)
        at.text_input(key="lab_token_typed").set_value(TEACHER)
        at.button(key="btn_lab_attach").click().run()
        follower = classroom().follower
        assert follower is not None and follower.url == base
        wait_until(lambda: follower.reports, what="the follower's catch-up")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        text = _texts(at)
        assert f"第 {follower.reports[-1].step} 步" in text
        assert "回答为贪心解码（温度 0）" in text  # the room's sampling, from the server
        assert 'data-testid="request-client">dora<' in text
        assert untranslated(text) == [], untranslated(text)
        assert [b.label for b in at.main.button][:4] == ["断开", "单步", "暂停", "运行"]  # the teacher's controls
        at.radio(key="layout__zh").set_value("projector").run()  # the address to join, open, with its QR code
        assert not at.exception and 'data-testid="join-qr"><img' in _texts(at) and "加入课堂" in _texts(at)
        assert untranslated(_texts(at)) == [], untranslated(_texts(at))
        _open_page(at, "send")
        assert not at.exception, [e.value for e in at.exception]
        assert at.title[0].value == "发送请求" and untranslated(_texts(at)) == []
        assert "回答为贪心解码（温度 0）" in _texts(at)
        # A browser on another machine (a student's): the view without controls, until the teacher token is typed.
        monkeypatch.setattr(classroom_page, "local_browser", lambda: False)
        other = AppTest.from_file(APP, default_timeout=60)
        other.run()
        _open_page(other, "classroom")
        assert "Step" not in [b.label for b in other.main.button] and 'request-client">dora<' in _texts(other)
        assert "Detach" not in [b.label for b in other.main.button]
        other.text_input(key="lab_token_entry").set_value("not-the-token").run()
        assert "Step" not in [b.label for b in other.main.button] and other.main.error
        other.text_input(key="lab_token_entry").set_value(TEACHER).run()
        assert not other.exception and [b.label for b in other.main.button][:4] == ["Detach", "Step", "Pause", "Run"]
        monkeypatch.setattr(classroom_page, "local_browser", lambda: True)
        # The saved session replays on the Live engine page like any run, each request with its client.
        raw = httpx.get(f"{base}/lab/session").content
        at.session_state["loaded_run"], at.session_state["loaded_run_name"] = load_run(raw, name="s.json"), "s.json"
        at.session_state["loaded_run_clients"] = session_clients(raw)
        _open_page(at, "")  # the default page, Live engine
        assert not at.exception, [e.value for e in at.exception]
        assert 'data-testid="request-client">dora<' in _texts(at)
    finally:
        classroom().detach()


def test_sigterm_in_step_mode_with_a_viewer_attached_stops_promptly(tiny_llama_dir):
    """`python -m engine serve` in step mode, with a viewer on the step stream and a request waiting
    for a Step: SIGTERM leaves step mode, the request is answered, the stream ends with the last
    steps, and the process exits well within uvicorn's grace period. It printed the teacher token."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parent.parent
    process = subprocess.Popen([sys.executable, "-m", "engine", "serve", str(tiny_llama_dir), "--port", str(port),
                                "--num-gpu-blocks-override", "16", "--lab-mode", "step", "--shutdown-timeout", "2",
                                "--uvicorn-log-level", "warning"],
                               cwd=root, env=dict(os.environ, PYTHONPATH=str(root)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, base)
        viewer = Viewer(base)
        done: dict = {}
        asker = threading.Thread(target=lambda: done.update(r=httpx.post(f"{base}/v1/completions", timeout=60, json={
            "prompt": "Hi", "max_tokens": 4, "ignore_eos": True, "user": "eve"})), daemon=True)
        asker.start()
        wait_until(lambda: any(k == "request" for k, _ in viewer.events), what="the request event")
        assert viewer.steps() == [], "step mode stepped without a Step"
        stopped = time.monotonic()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
        took = time.monotonic() - stopped
    finally:
        if process.poll() is None:
            process.kill()
    assert took < 15, f"the stop took {took:.0f} s"
    asker.join(10)
    assert done["r"].status_code == 200 and done["r"].json()["usage"]["completion_tokens"] == 4  # stepped to its end while draining
    assert viewer.closed.wait(10), "the step stream did not end"
    assert viewer.steps() and viewer.steps() == list(range(len(viewer.steps())))
    assert re.search(r"teacher token \(for POST /lab/control and the app's Step / Run controls\): \S{16}", err), err


def test_a_server_the_app_started_stops_when_the_app_exits(tiny_llama_dir, tmp_path):
    """The Classroom page's "start a server here" (app_pages/classroom_link.start_server) leaves no server
    behind: when the app's process exits, the server it started is stopped with it. Its log is in the
    user cache, not in the checkout."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = (f"from pathlib import Path\nfrom app_pages.classroom_link import start_server, wait_ready\n"
              f"server = start_server({port}, 'teacher-token', ['--model', {str(tiny_llama_dir)!r}, '--num-gpu-blocks-override', '16', '--no-cpu-kernels'])\n"
              f"assert wait_ready(server, 180), server.log_tail()\nprint(server.process.pid, flush=True)\n")
    cache = tmp_path / "cache"
    app = subprocess.run([sys.executable, "-c", script], cwd=root, env=dict(os.environ, PYTHONPATH=str(root), PAGEDATTENTION_LAB_CACHE=str(cache)),
                         capture_output=True, text=True, timeout=300)
    assert app.returncode == 0, app.stderr[-2000:]
    pid = int(app.stdout.split()[-1])
    assert (cache / "classroom" / f"classroom_server_{port}.log").is_file() and not (root / "artifacts" / f"classroom_server_{port}.log").exists()
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower(),
               timeout=40, what="the app's server to stop")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def _finished_request(base: str, engine, user: str) -> None:
    """A request from ``user``, stepped (step mode) until it finished."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=60)
    asker = threading.Thread(target=lambda: client.completions.create(model=engine.model_name, prompt="Hi", max_tokens=2,
                                                                       user=user, extra_body={"ignore_eos": True}), daemon=True)
    before = httpx.get(f"{base}/lab/control").json()["num_requests"]
    asker.start()
    wait_until(lambda: httpx.get(f"{base}/lab/control").json()["num_requests"] == before + 1, what=f"{user}'s request")
    while asker.is_alive() and control(base, action="step")["stepped"]:
        pass
    asker.join(10)


def _app(tiny_llama_dir, monkeypatch, query: dict | None = None):
    from streamlit.testing.v1 import AppTest

    from app_pages.state import MODEL_ENV
    from tests.test_app import APP

    monkeypatch.setenv(MODEL_ENV, str(tiny_llama_dir))
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params.update(query or {})
    return at.run()


def test_only_the_teacher_attaches_or_starts_a_server(tiny_llama_dir, cpu_kernels_built, monkeypatch):
    """Before any server is attached, a browser on another machine gets no attach or start form (it
    would let a student make the teacher's machine fetch any address, or start a server with any
    model): it is asked for the teacher token and a wrong one is refused; the app's teacher token
    (printed in the app's terminal) makes it the teacher's. A browser on this machine is the teacher's."""
    from app_pages import classroom as classroom_page
    from app_pages.common import plain
    from tests.test_app import _open_page
    from visualize.i18n import t

    room = classroom_page.classroom()
    room.close()
    monkeypatch.setattr(classroom_page, "local_browser", lambda: False)
    student = _open_page(_app(tiny_llama_dir, monkeypatch), "classroom")
    assert not student.exception, [e.value for e in student.exception]
    assert [w.key for w in student.main.text_input] == ["lab_token_entry"]
    assert not {"Attach", "Start the server"} & {b.label for b in student.main.button} and not student.main.radio[1:]
    assert t("teacher_only", "en") in [c.value for c in student.main.caption]
    student.text_input(key="lab_token_entry").set_value("a-guess").run()
    assert [e.value for e in student.main.error] == [t("token_entry_refused", "en", error=plain(t("token_not_teacher", "en")))]
    assert [w.key for w in student.main.text_input] == ["lab_token_entry"]
    student.text_input(key="lab_token_entry").set_value(room.key).run()  # the token from the teacher's terminal
    assert "lab_url" in [w.key for w in student.main.text_input] and "Attach" in [b.label for b in student.main.button]
    monkeypatch.setattr(classroom_page, "local_browser", lambda: True)
    teacher = _open_page(_app(tiny_llama_dir, monkeypatch), "classroom")
    assert "lab_url" in [w.key for w in teacher.main.text_input] and "Attach" in [b.label for b in teacher.main.button]


def test_the_join_link_carries_the_language_and_opens_the_send_page_only(server, tiny_llama_dir, cpu_kernels_built, monkeypatch):
    """The join link (and its QR code) is the Send page in student mode in the class's language; a
    session opened by it starts in that language and has the Send page only, without the teacher's
    pages and engine settings. Any page opened with ?lang=zh starts in Chinese."""
    from urllib.parse import parse_qs, urlsplit

    from app_pages.classroom import classroom
    from tests.test_app import _open_page

    base, _, _ = server
    at = _app(tiny_llama_dir, monkeypatch, {"lang": "zh"})
    assert not at.exception and at.radio(key="lang").value == "zh" and at.title[0].value == "PagedAttention 实验室"
    try:
        _open_page(at, "classroom")
        at.text_input(key="lab_url").set_value(base)
        at.text_input(key="lab_token_typed").set_value(TEACHER)
        at.button(key="btn_lab_attach").click().run()
        link = urlsplit(at.text_input(key="join_url").value)
        assert link.path == "/send" and parse_qs(link.query) == {"mode": ["student"], "lang": ["zh"]}
        at.radio(key="lang").set_value("en").run()
        assert parse_qs(urlsplit(at.text_input(key="join_url").value).query)["lang"] == ["en"]
        phone = _app(tiny_llama_dir, monkeypatch, {"mode": "student", "lang": "zh"})
        assert not phone.exception, [e.value for e in phone.exception]
        assert phone.title[0].value == "发送请求" and [r.key for r in phone.sidebar.radio] == ["lang"]
        assert sorted(p["url_pathname"] for p in phone._registered_pages.values()) == ["", "send"]  # both the Send page
        assert not phone.sidebar.slider and not phone.sidebar.number_input and not phone.sidebar.header
        phone.radio(key="lang").set_value("en").run()  # the student's own switch: still the Send page only
        assert phone.title[0].value == "Send a request" and not phone.sidebar.slider
    finally:
        classroom().close()


def test_classroom_sidebar_shows_the_servers_engine_and_folds_finished_requests(server, tiny_llama_dir, cpu_kernels_built, monkeypatch):
    """Attached, the Classroom page's sidebar shows the server's engine (32 blocks of 4 slots here, not
    this browser's 64 of 16), this browser's settings folded under it; the desk layout lists the
    finished requests folded, so the block tables stay near the top."""
    from app_pages.classroom import classroom
    from tests.test_app import _open_page

    base, _, engine = server
    _finished_request(base, engine, "erin")
    at = _open_page(_app(tiny_llama_dir, monkeypatch), "classroom")
    try:
        at.text_input(key="lab_url").set_value(base)
        at.text_input(key="lab_token_typed").set_value(TEACHER)
        at.button(key="btn_lab_attach").click().run()
        follower = classroom().follower
        wait_until(lambda: follower.reports and follower.settings, what="the follower's catch-up")
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert [h.value for h in at.sidebar.header][:2] == ["The server's engine", "Engine settings"]
        sidebar = " ".join(m.value for m in at.sidebar.markdown)
        assert "KV pool (blocks): **32**" in sidebar and "Block size (tokens per block): **4**" in sidebar
        assert "This browser's engine settings (Live engine)" in [e.label for e in at.sidebar.expander]
        folded = next(e for e in at.main.expander if e.label.startswith("Finished requests ("))
        inside = " ".join(m.value for m in folded.markdown)
        assert 'request-client">erin<' in inside
        assert sum('request-client">erin<' in m.value for m in at.main.markdown) == sum('request-client">erin<' in m.value for m in folded.markdown)
    finally:
        classroom().close()


def test_a_restarted_server_on_the_same_address_replaces_the_old_ones_requests_and_steps():
    """Two starts of a server share an address and reuse request ids and step numbers: the hello's
    server_id tells them apart, and the follower keeps nothing of the first."""
    from app_pages.classroom_link import Follower

    old, new = (StepHub({"model_name": "m", "block_size": 4, "num_blocks": 8, "bytes_per_slot": 2}, {}) for _ in range(2))
    assert old.header()["server_id"] != new.header()["server_id"]
    for i in range(3):
        old.note_request(i, f"s{i}", f"old prompt {i}", 4)
    new.note_request(0, "anonymous", "new prompt", 4)
    follower = Follower("http://127.0.0.1:9")  # nothing listens: only the events below reach it
    try:
        follower._on("hello", json.loads(json.dumps(old.header())))
        assert sorted(follower.requests) == [0, 1, 2] and not follower.restarted
        follower._on("hello", json.loads(json.dumps(old.header())))  # a reconnect to the same server keeps its data
        assert sorted(follower.requests) == [0, 1, 2] and not follower.restarted
        follower._on("hello", json.loads(json.dumps(new.header())))
        assert follower.requests == {0: {"client": "anonymous", "prompt": "new prompt", "max_tokens": 4}}
        assert follower.restarted and follower.reports == []
    finally:
        follower.stop()
