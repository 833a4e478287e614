"""Your parts (app_pages/labs_page.py) in a real browser: a find-the-bug lab's seeded part runs beside the
engine's own and the page names the first step and event where they differ, in English and in Chinese; a
starter's exception is shown with its lab, file and line, and the app keeps working."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.test_app_browser import CHROMIUM, free_port, no_exception_box, start_server

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def choose(page, option: str) -> None:
    """Pick ``option`` in the sidebar's implementation box (its label in either language)."""
    box = page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').filter(has_text="实验实现").or_(
        page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').filter(has_text="Lab implementation"))
    box.locator("input").click()
    page.keyboard.type(option)
    page.keyboard.press("Enter")
    for _ in range(100):
        if box.locator("input").input_value() == option:
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"the implementation box shows {box.locator('input').input_value()!r}, not {option!r}")


def alert_text(page, kind: str, timeout_s: float = 120) -> str:
    alert = page.locator('[data-testid="stAlertContainer"], [data-testid="stAlert"]').filter(has_text=kind).first
    alert.wait_for(timeout=timeout_s * 1000)
    return alert.inner_text()


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_a_seeded_bug_beside_the_engine_in_english_and_chinese():
    sync_api = pytest.importorskip("playwright.sync_api")
    from lessons import compare, labs
    from visualize.i18n import t

    bug = str(labs.starter_path(labs.get("bug_cow")))
    found = compare.first_divergence(compare.run("solution"), compare.run(bug))
    expected = {lang: t("labs_diverged", lang, step=found["step"], what=t("labs_what_events", lang, index=found["event"]))
                for lang in ("en", "zh")}
    port = free_port()
    app = start_server(port, {k: v for k, v in os.environ.items() if k not in ("LAB_IMPL", "LAB_ONLY")})
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            page = browser.new_page(viewport={"width": 1440, "height": 1600})
            for attempt in range(600):
                try:
                    page.goto(f"http://127.0.0.1:{port}/labs", timeout=5000)
                    break
                except sync_api.Error:
                    assert app.poll() is None, app.stdout.read()
                    page.wait_for_timeout(300)
            page.get_by_role("button", name="Run beside the engine").wait_for(timeout=300_000)
            choose(page, "bug_cow")
            page.get_by_role("button", name="Run beside the engine").click()
            assert expected["en"] in alert_text(page, "First difference")
            assert "copy_on_write" in page.locator('[data-testid="stJson"]').first.inner_text()
            page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
            assert expected["zh"] in alert_text(page, "第一次不同")
            no_exception_box(page)
            choose(page, "block_pool")  # a starter: its first part raises in step 0
            page.get_by_role("button", name="与引擎并排运行").click()
            text = alert_text(page, "抛出异常")
            assert "block_pool" in text and "labs/starters/block_pool.py" in text and "NotImplementedError" in text
            choose(page, "bug_slot")  # the app keeps working after a student's exception
            page.get_by_role("button", name="与引擎并排运行").click()
            assert "第 0 步" in alert_text(page, "第一次不同")
            no_exception_box(page)
            browser.close()
    finally:
        app.terminate()
        app.wait(30)
