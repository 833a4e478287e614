"""The app attached to a live engine server, in a real browser (chromium through Playwright), in English
and in 中文: a request sent with the `openai` client shows up in the Classroom page's block tables,
labelled with its `user`, within a few seconds of the Step that schedules it; each click on Step
advances the server by exactly one step. One engine server (a tiny random model, a small pool, step
mode) and one app for the module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.test_app_browser import _stop_with_parent, free_port, no_exception_box, open_app, start_server, step_button

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TOKEN = "browser-teacher-token"
STEP = {"en": "Step", "zh": "单步"}
HEADING = {"en": "Step {n}", "zh": "第 {n} 步"}


@pytest.fixture(scope="module")
def engine_server(tiny_llama_dir):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    process = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", "--model", str(tiny_llama_dir), "--port", str(port), "--num-gpu-blocks-override", "32",
         "--block-size", "4", "--max-num-seqs", "4", "--teacher-token", TOKEN, "--lab-mode", "step", "--uvicorn-log-level", "warning"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_stop_with_parent if sys.platform.startswith("linux") else None)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read() if process.poll() is not None else "no start"
        time.sleep(0.3)
    yield url
    process.terminate()
    process.wait(30)


def next_step(url: str) -> int:
    return httpx.get(f"{url}/lab/control", timeout=10).json()["next_step"]


def send(url: str, user: str) -> threading.Thread:
    """A streaming chat request from ``user`` on a thread (step mode: it ends as the teacher steps)."""
    def run() -> None:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        for _ in client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name three fruits."}],
                                                max_tokens=3, temperature=0, user=user, stream=True):
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_app_attached_to_a_live_server(engine_server):
    sync_api = pytest.importorskip("playwright.sync_api")
    port = free_port()
    app = start_server(port, {k: v for k, v in os.environ.items() if k != "PAGEDATTENTION_LAB_MODEL"})
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            page = browser.new_page(viewport={"width": 1440, "height": 2000})
            try:
                open_app(page, sync_api, port, app)
                page.goto(f"http://127.0.0.1:{port}/classroom")
                # Attach: the server's address and the teacher token.
                page.get_by_role("textbox", name="Server address").fill(engine_server)
                page.get_by_role("textbox", name="Teacher token").fill(TOKEN)
                page.get_by_role("button", name="Attach").click()
                page.locator('[data-testid="stExpander"] summary').filter(has_text="Join the class").click(timeout=30_000)
                page.locator('[data-testid="join-qr"] img').wait_for(timeout=30_000)
                assert "/send" in page.locator('[data-testid="join-address"]').inner_text()
                for lang, user in (("en", "alice"), ("zh", "bob")):
                    if lang == "zh":
                        page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
                    asker = send(engine_server, user)
                    wait_for_request(engine_server, user)
                    before = next_step(engine_server)
                    click_step(page, lang, before)
                    # The request holds blocks after its prefill: its block table is labelled with its user.
                    page.locator('[data-testid="request-client"]').filter(has_text=user).first.wait_for(timeout=5_000)
                    assert next_step(engine_server) == before + 1
                    click_step(page, lang, before + 1)
                    assert next_step(engine_server) == before + 2, "one click, one step"
                    click_step(page, lang, before + 2)  # its third token: the request ends
                    asker.join(30)
                    assert not asker.is_alive()
                    no_exception_box(page)
                    (ROOT / "artifacts" / "screenshots").mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(ROOT / "artifacts" / "screenshots" / f"classroom_{lang}.png"), full_page=True)
                student_sends_a_prompt(browser, port, engine_server)
            except Exception:
                (ROOT / "artifacts" / "screenshots").mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ROOT / "artifacts" / "screenshots" / "classroom_failure.png"), full_page=True)
                raise
            browser.close()
    finally:
        app.kill()
        out, _ = app.communicate(timeout=30)
        print(out[-3000:] if out else "")


def wait_for_request(url: str, user: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snapshot = httpx.get(f"{url}/lab/snapshot", timeout=10).json()
        if any(r["client"] == user for r in snapshot["requests"].values()):
            return
        time.sleep(0.1)
    raise AssertionError(f"{user}'s request never reached the server")


def click_step(page, lang: str, step: int) -> None:
    """Click the Classroom page's Step once; the page then shows that step's heading."""
    button = step_button(page) if lang == "en" else page.get_by_role("button", name=STEP[lang], exact=True).and_(
        page.locator('xpath=//*[not(ancestor-or-self::*[@data-stale="true"])]'))
    button.click()
    page.get_by_role("heading", name=HEADING[lang].format(n=step), exact=True).wait_for(timeout=10_000)


def student_sends_a_prompt(browser, port: int, url: str) -> None:
    """A student's phone: the Send page, a name, a prompt; the teacher steps; the answer streams into
    the chat and the student's blocks are named under the pool map."""
    phone = browser.new_page(viewport={"width": 420, "height": 1600})
    phone.goto(f"http://127.0.0.1:{port}/send")
    phone.get_by_role("textbox", name="Your name").fill("carol")
    phone.get_by_role("textbox", name="Your name").press("Enter")
    phone.wait_for_timeout(1500)  # the name's rerun, before the prompt's
    box = phone.get_by_placeholder("Ask the model something")
    box.fill("What is a KV cache?")
    box.press("Enter")
    try:
        chat_and_blocks(phone, url)
    except Exception:
        phone.screenshot(path=str(ROOT / "artifacts" / "screenshots" / "classroom_send_failure.png"), full_page=True)
        raise
    no_exception_box(phone)
    phone.screenshot(path=str(ROOT / "artifacts" / "screenshots" / "classroom_send_en.png"), full_page=True)
    phone.close()


def chat_and_blocks(phone, url: str) -> None:
    wait_for_request(url, "carol")
    final = ""
    for _ in range(60):  # step until the answer ends (48 tokens at most)
        answer = httpx.post(f"{url}/lab/control", json={"action": "step"}, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60).json()
        if not answer["stepped"]:
            break
        if answer["step"] == next_step(url) - 1 and final == "":
            phone.get_by_text("Your blocks are outlined in pink", exact=False).wait_for(timeout=10_000)
            final = "seen"
    reply = phone.locator('[data-testid="reply-text"]').first
    deadline = time.monotonic() + 15
    while not reply.inner_text().strip():
        assert time.monotonic() < deadline, "no answer streamed into the chat"
        phone.wait_for_timeout(200)
    assert final == "seen", "the student's blocks were never outlined"
