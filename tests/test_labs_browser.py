"""A student's lab parts beside the engine's own in a real browser. On the Live engine page
(app_pages/beside_panel.py) a find-the-bug lab's seeded part steps in a second engine beside the page's
own, and the page names the first step, event and block where they differ, in English and in Chinese.
On Your parts (app_pages/labs_page.py) the same on the fixed workload; a starter's exception is shown
with its lab, file and line, and the app keeps working."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.test_app_browser import CHROMIUM, free_port, in_browser, no_exception_box, open_app, start_server, step_button

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


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_the_live_page_steps_a_seeded_bug_beside_the_engine_in_english_and_chinese(tiny_llama_dir):
    """bug_slot writes each token one slot too far: the first Step's first WRITE event differs, in the
    slot, and the page says so, shows both events, and outlines the block (tiny model)."""
    in_browser(tiny_llama_dir, live_beside, "failure_live_beside.png")


def live_beside(page, sync_api, port, server) -> None:
    import re

    open_app(page, sync_api, port, server)
    choose(page, "bug_slot")
    page.get_by_text("A second engine runs your lab parts").wait_for(timeout=300_000)
    step_button(page).click()
    text = alert_text(page, "First difference")
    found = re.search(r"First difference at step 0: event (\d+) differs\.", text)
    assert found, text
    boxes = page.locator('[data-testid="stJson"]')
    # st.json draws one "key":value a line, as a person reads it
    engine_event, their_event = (dict(re.findall(r'"(\w+)":"?([^"\n]*)"?', boxes.nth(i).inner_text())) for i in range(2))
    assert engine_event["kind"] == their_event["kind"] == "write", (engine_event, their_event)
    assert int(their_event["slot"]) == int(engine_event["slot"]) + 1, "the seeded bug: one slot too far"
    block = page.get_by_test_id("beside-wrong-block")
    assert f"The first wrong block: block {engine_event['block_id']}" in block.inner_text()
    assert page.get_by_role("heading", name="Yours · Step 0").count() == 1
    page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
    assert f"第一次不同出现在第 0 步：第 {found[1]} 个事件不同。" in alert_text(page, "第一次不同")
    assert f"第一个出错的块：块 {engine_event['block_id']}" in page.get_by_test_id("beside-wrong-block").inner_text()
    no_exception_box(page)
