"""Who is the teacher, in a real browser (chromium through Playwright): the app served to the network as
the teacher's guide starts it, a browser on the app's machine (127.0.0.1) and browsers on "other
machines" (this machine's network address, which the app sees as another peer).

- A student who opens the Classroom page first gets no attach or start form.
- The teacher starts a server here; after a reload the page still has Step / Pause / Run, Detach and
  Stop, and shows the teacher token, the one the app printed in its terminal.
- The projector PC's browser types that token and is the teacher's, also after a reload (its cookie);
  a student's browser is not.
- The join link carries the class's language and student mode: it opens the Send page alone, in 中文.
- Stop stops the server.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.test_app_browser import _stop_with_parent, free_port, no_exception_box

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FRESH = 'xpath=//*[not(ancestor-or-self::*[@data-stale="true"])]'  # not a stale copy from the previous run


def network_address() -> str | None:
    from app_pages.classroom import lan_address

    return lan_address()


class App:
    """``streamlit run app.py`` open to the network (as docs/classroom.md starts it), its terminal read."""

    def __init__(self, model_dir: Path):
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLIT_")}
        env.update(PAGEDATTENTION_LAB_ALLOW_REMOTE="1", PAGEDATTENTION_LAB_MODEL=str(model_dir), PYTHONPATH=str(ROOT))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.address", "0.0.0.0",
             "--server.port", str(self.port), "--browser.gatherUsageStats", "false"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=_stop_with_parent if sys.platform.startswith("linux") else None)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(iter(self.process.stdout.readline, "")), daemon=True).start()
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/_stcore/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert self.process.poll() is None and time.monotonic() < deadline, "".join(self.lines)[-3000:]
            time.sleep(0.3)

    def printed_token(self) -> str:
        """The teacher token as the terminal shows it."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = re.findall(r"classroom: teacher token (\S+)", "".join(self.lines))
            if found:
                return found[-1]
            time.sleep(0.2)
        raise AssertionError("no teacher token in the app's terminal:\n" + "".join(self.lines)[-3000:])

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(30)
        print("".join(self.lines)[-3000:])


def heading(page, name: str, timeout_s: float = 120) -> None:
    page.get_by_role("heading", name=name, exact=True).and_(page.locator(FRESH)).first.wait_for(timeout=timeout_s * 1000)


def button(page, name: str):
    return page.get_by_role("button", name=name, exact=True).and_(page.locator(FRESH))


def teacher_controls(page, timeout_s: float = 60) -> None:
    """Step, Pause and Run are on the page, Detach and Stop the server in the Engine server panel."""
    for name in ("Step", "Pause", "Run"):
        button(page, name).first.wait_for(timeout=timeout_s * 1000)
    panel = page.locator('[data-testid="stExpander"]').filter(has_text="Engine server").first
    if panel.locator("details").first.get_attribute("open") is None:  # folded: unfold it (a click on an open one folds it)
        panel.locator("summary").first.click()
    for name in ("Detach", "Stop the server"):
        panel.get_by_role("button", name=name, exact=True).first.wait_for(timeout=30_000)


def no_controls(page) -> None:
    """The view without any teacher control (the step view is drawn: its mode line is there)."""
    page.get_by_text("Step mode: the server advances one step per Step.").first.wait_for(timeout=60_000)
    page.wait_for_timeout(1500)  # a control would have been drawn with the view
    for name in ("Step", "Pause", "Detach", "Stop the server", "Attach", "Start the server"):
        assert button(page, name).count() == 0, f"{name} shown to a student"


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_the_teacher_keeps_control_across_reloads_and_only_the_teacher(tiny_llama_dir, cpu_kernels_built):
    sync_api = pytest.importorskip("playwright.sync_api")
    lan = network_address()
    if lan is None or lan.startswith("127."):
        pytest.skip("no network address: another machine's browser cannot be played")
    SHOTS.mkdir(parents=True, exist_ok=True)
    app = App(tiny_llama_dir)
    server_port = free_port()
    local, remote = f"http://127.0.0.1:{app.port}", f"http://{lan}:{app.port}"
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            student = browser.new_context(viewport={"width": 1400, "height": 1600}).new_page()
            teacher = browser.new_context(viewport={"width": 1400, "height": 1600}).new_page()
            projector = browser.new_context(viewport={"width": 1400, "height": 1600}).new_page()
            current = student
            try:
                # A student opens the Classroom page before the teacher: no way to attach or start a server.
                student.goto(f"{remote}/classroom")
                heading(student, "Classroom")
                student.get_by_text("Only the teacher can attach a server or start one", exact=False).wait_for(timeout=60_000)
                assert button(student, "Attach").count() == 0 and button(student, "Start the server").count() == 0
                assert student.get_by_role("textbox", name="Server address").count() == 0

                # The teacher, on the app's machine, starts a server here.
                current = teacher
                teacher.goto(f"{local}/classroom")
                heading(teacher, "Classroom")
                teacher.get_by_text("Start a server here", exact=True).click()
                port_box = teacher.get_by_role("spinbutton", name="Port")
                port_box.fill(str(server_port))
                port_box.press("Enter")
                teacher.wait_for_timeout(1000)
                button(teacher, "Start the server").click()
                teacher_controls(teacher, timeout_s=240)

                # F5: the controls are still there, and the token is shown (folded): the terminal's.
                teacher.reload()
                heading(teacher, "Classroom")
                teacher_controls(teacher)
                teacher.locator('[data-testid="stExpander"] summary').filter(has_text="Teacher token").click()
                shown = teacher.locator('[data-testid="stExpander"]').filter(has_text="Teacher token").locator("pre").first
                shown.wait_for(timeout=10_000)
                token = shown.inner_text().strip()
                assert token == app.printed_token()
                server = f"http://127.0.0.1:{server_port}"
                answer = httpx.post(f"{server}/lab/control", json={"action": "status"}, headers={"Authorization": f"Bearer {token}"})
                assert answer.status_code == 200 and answer.json()["mode"] == "step"
                no_exception_box(teacher)

                # The projector PC's browser: the view, until the token is typed; then the controls, after F5 too.
                current = projector
                projector.goto(f"{remote}/classroom")
                heading(projector, "Classroom")
                no_controls(projector)
                box = projector.get_by_role("textbox", name="Teacher token")
                if not box.is_visible():  # in the folded Engine server panel
                    projector.locator('[data-testid="stExpander"] summary').filter(has_text="Engine server").click()
                box.fill(token)
                box.press("Enter")
                teacher_controls(projector)
                projector.reload()
                heading(projector, "Classroom")
                teacher_controls(projector)
                projector.screenshot(path=str(SHOTS / "classroom_projector_pc_after_reload.png"), full_page=True)

                # The student's browser, reloaded: still the view only.
                current = student
                student.reload()
                heading(student, "Classroom")
                no_controls(student)

                # The class speaks Chinese: the join link says so, and opens the Send page alone, in 中文.
                current = teacher
                teacher.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
                heading(teacher, "课堂")
                teacher.locator('[data-testid="stExpander"] summary').filter(has_text="加入课堂").click()
                address = teacher.locator('[data-testid="join-address"]').first
                address.wait_for(timeout=30_000)
                link = address.inner_text().strip()
                assert parse_qs(urlsplit(link).query) == {"mode": ["student"], "lang": ["zh"]}, link
                assert urlsplit(link).path == "/send" and urlsplit(link).port == app.port
                current = student
                student.goto(link.replace(urlsplit(link).hostname, lan))
                heading(student, "发送请求")
                student.get_by_role("textbox", name="你的名字").wait_for(timeout=30_000)
                student.get_by_placeholder("向模型提个问题").wait_for(timeout=30_000)
                assert student.get_by_text("Page not found").count() == 0
                assert student.locator('[data-testid="stSidebarNav"]').count() == 0, "the teacher's pages are listed"
                sidebar = student.locator('[data-testid="stSidebar"]')
                assert sidebar.count() == 0 or "引擎设置" not in sidebar.inner_text()
                no_exception_box(student)
                student.screenshot(path=str(SHOTS / "classroom_student_link_zh.png"), full_page=True)

                # Stop: the server is gone, the page says there is none.
                current = teacher
                panel = teacher.locator('[data-testid="stExpander"]').filter(has_text="引擎服务器").first
                if not panel.get_by_role("button", name="停止服务器", exact=True).first.is_visible():
                    panel.locator("summary").first.click()
                panel.get_by_role("button", name="停止服务器", exact=True).first.click()
                teacher.get_by_text("还没有服务器", exact=False).first.wait_for(timeout=60_000)
                with pytest.raises(httpx.HTTPError):
                    httpx.get(f"{server}/health", timeout=2)
            except Exception:
                current.screenshot(path=str(SHOTS / "classroom_teacher_failure.png"), full_page=True)
                raise
            browser.close()
    finally:
        app.stop()
