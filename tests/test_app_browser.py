"""The app in a real browser (Debian's chromium through Playwright) with the default model.

Prints two timings (goals, not assertions, because a shared CI machine is noisy):
- cold start: ``streamlit run`` launched -> the Step button is clickable (goal <= 10 s, model cached);
- step latency: click on Step -> the page shows the new step, 8 requests, torch backend (goal <= 1 s).
Screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def step_button(page):
    """The Live page's Step button, not a stale copy: while a rerun redraws the page (slow on a busy
    machine), Streamlit keeps the previous run's elements, marked data-stale, beside the new ones."""
    fresh = page.locator('xpath=//*[not(ancestor-or-self::*[@data-stale="true"])]')
    return page.get_by_role("button", name="Step", exact=True).and_(fresh)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def no_exception_box(page) -> None:
    boxes = page.locator('[data-testid="stException"]')
    assert boxes.count() == 0, boxes.first.inner_text()


def step_title(page, text: str, timeout_s: float = 120) -> None:
    page.get_by_role("heading", name=text, exact=True).wait_for(timeout=timeout_s * 1000)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def download(page, button_name: str, path) -> None:
    """Click a download button and save the file. A download whose data is made on click (the whole
    run) is registered anew by every rerun of the step fragment; a click that lands on the button of
    a render just replaced gets no file, so it is clicked again (at most three times)."""
    for attempt in range(3):
        try:
            with page.expect_download(timeout=20_000) as event:
                page.get_by_role("button", name=button_name).click()
            event.value.save_as(path)
            return
        except Exception:  # playwright's TimeoutError: no download started
            if attempt == 2:
                raise
            page.wait_for_timeout(1000)


def test_app_in_a_browser(default_model_dir):
    sync_api = pytest.importorskip("playwright.sync_api")
    SHOTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PAGEDATTENTION_LAB_MODEL"}  # the default model
    started = time.perf_counter()
    server = start_server(port, env)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            page = browser.new_page(viewport={"width": 1440, "height": 2000})
            try:
                drive(page, sync_api, port, started, server)
            except Exception:
                page.screenshot(path=str(SHOTS / "failure.png"), full_page=True)
                raise
            browser.close()
    finally:
        server.kill()
        out, _ = server.communicate(timeout=30)
        print(out[-3000:] if out else "")


def drive(page, sync_api, port: int, started: float, server) -> None:
    """The classroom path: open, load the 8-request preset, step, switch allocator, switch language."""
    deadline = time.time() + 120
    while True:  # the server needs a moment before it accepts connections
        try:
            page.goto(f"http://127.0.0.1:{port}/", timeout=5000)
            break
        except sync_api.Error:
            if time.time() > deadline or server.poll() is not None:
                raise
            time.sleep(0.3)
    step = step_button(page)
    step.wait_for(timeout=120_000)
    cold_start = time.perf_counter() - started
    print(f"\ncold start to an interactive page: {cold_start:.1f} s (goal <= 10 s)")
    no_exception_box(page)
    streamed_text_is_the_final_text(page)

    # 8 requests: the classroom preset that forces preemption.
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Workload").click()
    page.get_by_role("button", name="Load preset").wait_for()
    preset = page.locator('[data-testid="stSelectbox"]').filter(has_text="Classroom preset")
    preset.click()
    page.get_by_role("option", name="Mix that forces preemption").click()
    page.get_by_role("button", name="Load preset").click()
    # The engine is rebuilt with the 8 requests before Step does anything.
    page.get_by_text("Request 7", exact=True).wait_for(timeout=60_000)
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Workload").click()  # fold it away
    step = step_button(page)
    step.wait_for(timeout=60_000)

    # Step until a generated token is visible and the pool holds blocks.
    step.click()
    step_title(page, "Step 0")
    step.click()
    step_title(page, "Step 1")
    # The heading comes first in the page; the requests' texts are written a moment later (a CI run
    # read them before they were): wait for them as a reader would, up to 30 s.
    texts = page.locator('[data-testid="request-text"]')
    deadline = time.time() + 30
    while not any(texts.nth(i).inner_text().strip() for i in range(texts.count())):
        assert time.time() < deadline, "no generated text visible"
        page.wait_for_timeout(200)
    page.locator('[data-testid="stVegaLiteChart"]').nth(1).wait_for(timeout=30_000)  # pool map + memory, drawn after the text
    assert page.get_by_text("Request 0", exact=False).count() > 0
    no_exception_box(page)
    wait_for_charts(page, 2)  # let Vega finish drawing before the screenshot
    assert chart_text_problems(page, "en") == []
    page.screenshot(path=str(SHOTS / "live_engine_en.png"), full_page=True)

    latencies = []
    for k in range(2, 7):
        t0 = time.perf_counter()
        step.click()
        step_title(page, f"Step {k}")
        latencies.append(time.perf_counter() - t0)
    print(f"step latency, 8 requests, torch backend: median {statistics.median(latencies):.2f} s, "
          f"all {', '.join(f'{x:.2f}' for x in latencies)} s (goal <= 1 s)")
    no_exception_box(page)

    # The contiguous allocator: the engine is rebuilt, stepping works and shows slot ranges.
    page.locator('[data-testid="stSidebar"]').get_by_text("contiguous (before vLLM)").click()
    step = step_button(page)
    step.wait_for(timeout=60_000)
    page.get_by_text("Press Step to run the first scheduler iteration.").wait_for(timeout=60_000)
    step.click()
    step_title(page, "Step 0")
    step.click()
    step_title(page, "Step 1")
    assert page.get_by_text("slots 0–", exact=False).count() > 0
    no_exception_box(page)
    page.wait_for_timeout(800)
    page.screenshot(path=str(SHOTS / "live_engine_contiguous_en.png"), full_page=True)

    # Play advances on its own (a fragment with a timer) until Pause.
    page.get_by_role("button", name="Play", exact=True).click()
    step_title(page, "Step 3")
    page.get_by_role("button", name="Pause", exact=True).click()
    page.get_by_role("button", name="Play", exact=True).wait_for(timeout=60_000)
    page.wait_for_timeout(500)
    current = page.get_by_role("heading", name=re.compile(r"^Step \d+$")).inner_text()
    page.wait_for_timeout(2500)  # paused: no further steps
    assert page.get_by_role("heading", name=re.compile(r"^Step \d+$")).inner_text() == current
    number = current.split()[1]

    # 中文.
    page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
    page.get_by_role("button", name="单步", exact=True).wait_for(timeout=60_000)
    step_title(page, f"第 {number} 步")
    no_exception_box(page)
    wait_for_charts(page, 2)
    assert chart_text_problems(page, "zh") == []
    page.screenshot(path=str(SHOTS / "live_engine_zh.png"), full_page=True)


def final_texts_of_the_default_preset() -> list[str]:
    """The engine's final texts (``RequestOutput.text``) of the default preset with the sidebar's defaults."""
    from app_pages.presets import PRESETS
    from app_pages.state import Settings, add_workload, build_engine, run_to_end

    llm = build_engine(Settings())
    add_workload(llm, PRESETS["preset_short_chat"]["rows"], temperature=0.0, seed=0)
    run_to_end(llm, 200)
    return [llm.get_output(rid).text for rid in sorted(llm.requests)]


def streamed_text_is_the_final_text(page) -> None:
    """The default preset run to its end on the Live page: each request's text, as the page joined it
    from the steps' streamed deltas, is the engine's final text, in English and in 中文 (no U+FFFD, no
    token emitted twice)."""
    expected = [" ".join(text.split()) for text in final_texts_of_the_default_preset()]
    main = page.locator('[data-testid="stMain"]')
    box = main.locator('[data-testid="stNumberInput"] input').first
    box.fill("40")
    box.press("Enter")
    page.wait_for_timeout(500)
    main.get_by_role("button", name="Run N steps").click()
    page.get_by_text("All requests finished.", exact=False).wait_for(timeout=180_000)
    for lang, name in (("en", "English"), ("zh", "中文")):
        if lang == "zh":
            page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
            page.get_by_role("button", name="单步", exact=True).wait_for(timeout=60_000)
        texts = page.locator('[data-testid="request-text"]')
        texts.nth(len(expected) - 1).wait_for(timeout=30_000)
        shown = [" ".join(texts.nth(i).inner_text().split()) for i in range(texts.count())]
        assert shown == expected, (lang, shown, expected)
        assert not any("\ufffd" in text for text in shown), lang
    page.locator('[data-testid="stSidebar"]').get_by_text("English").click()
    step_button(page).wait_for(timeout=60_000)


def start_server(port: int, env: dict) -> subprocess.Popen:
    """``streamlit run app.py`` on ``port``; on Linux it is stopped when this test process dies, however it
    dies (a killed pytest had left its server running: the tests' own teardown never ran)."""
    return subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
         "--server.address", "127.0.0.1", "--server.port", str(port), "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_stop_with_parent if sys.platform.startswith("linux") else None,
    )


def _stop_with_parent() -> None:
    """In the child, before exec: ask Linux for SIGKILL when the parent (pytest) dies (prctl PR_SET_PDEATHSIG).
    Not SIGTERM: Streamlit's own SIGTERM handler was seen to leave the server running."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def open_app(page, sync_api, port: int, server) -> None:
    deadline = time.time() + 120
    while True:
        try:
            page.goto(f"http://127.0.0.1:{port}/", timeout=5000)
            break
        except sync_api.Error:
            if time.time() > deadline or server.poll() is not None:
                raise
            time.sleep(0.3)
    page.get_by_role("button", name=re.compile("^(Step|单步)$")).wait_for(timeout=300_000)  # a loaded CI machine


# Every Vega chart of the page (the app draws them as SVG: visualize.style.as_svg): each visible text
# element with its box, and the box that clips it (the chart's svg, within its Streamlit container).
CHART_TEXTS_JS = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')].map((chart, index) => {
  const svg = chart.querySelector('svg');
  const canvas = chart.querySelectorAll('canvas').length;
  if (!svg) return {index, canvas, texts: []};
  const s = svg.getBoundingClientRect(), c = chart.getBoundingClientRect();
  const clip = {left: Math.max(s.left, c.left), right: Math.min(s.right, c.right),
                top: Math.max(s.top, c.top), bottom: Math.min(s.bottom, c.bottom)};
  const texts = [...svg.querySelectorAll('text')]
    .filter(t => t.textContent.trim() && getComputedStyle(t).visibility !== 'hidden' && +getComputedStyle(t).opacity !== 0)
    .map(t => { const r = t.getBoundingClientRect();
      return {text: t.textContent, font_px: parseFloat(getComputedStyle(t).fontSize), rotated: r.height > r.width,
              left: r.left - clip.left, right: clip.right - r.right,
              top: r.top - clip.top, bottom: clip.bottom - r.bottom}; });
  return {index, canvas, texts};
})"""
CHARTS_DRAWN_JS = """count => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')]
  .filter(chart => chart.querySelector('svg text')).length >= count"""
# A text's box is its glyph cells (the font's ascent to descent), larger than the ink: above a capital
# or a parenthesis about 0.2-0.25 em of it is empty. A box may stick out by this much with the ink inside.
SLACK_EM = 0.3


# Every metric's and widget's text the browser cut: an element that clips its overflow (an ellipsis,
# overflow hidden) and whose text is wider than its box, as Streamlit cuts a long metric label or a
# select box's chosen option. Stale elements (a rerun's previous copy) are left out.
WIDGET_TEXTS_JS = """() => {
  const roots = document.querySelectorAll('[data-testid="stMetric"], [data-testid="stSelectbox"], [data-testid="stNumberInput"], '
    + '[data-testid="stRadio"], [data-testid="stCheckbox"], [data-testid="stSlider"], [data-testid="stButton"]');
  const cut = [];
  for (const root of roots) {
    if (root.closest('[data-stale="true"]')) continue;
    for (const el of [root, ...root.querySelectorAll('*')]) {
      const s = getComputedStyle(el);
      if (!el.textContent.trim() || s.display === 'none' || s.visibility === 'hidden' || el.clientWidth === 0) continue;
      const clips = s.textOverflow === 'ellipsis' || s.overflowX === 'hidden' || s.overflowX === 'clip';
      if (clips && el.scrollWidth > el.clientWidth + 1) cut.push(el.textContent.trim());
    }
  }
  return [...new Set(cut)];
}"""


def widget_text_problems(page) -> list[str]:
    """The metrics' and widgets' texts the browser cut (labels, values, a select box's option)."""
    return [f"cut: {text!r}" for text in page.evaluate(WIDGET_TEXTS_JS)]


def wait_for_charts(page, count: int, timeout_s: float = 300) -> None:
    """Until the page shows ``count`` Vega charts with text in their svg (Vega draws after the page's
    text), and a moment more for the last one to finish."""
    page.wait_for_function(CHARTS_DRAWN_JS, arg=count, timeout=timeout_s * 1000)
    page.wait_for_timeout(800)


def chart_text_problems(page, lang: str) -> list[str]:
    """What is wrong with the text of the page's charts, as the browser drew it: a chart drawn on a
    canvas (its text cannot be read), a text that Vega cut with "…" (it exceeded a labelLimit or a
    title's limit), a text whose box lies outside its chart's box (cut off by the svg's edge), and, in
    中文, English UI text from the catalogue. Also asserts that the page has charts with text."""
    from visualize.i18n import untranslated

    charts = page.evaluate(CHART_TEXTS_JS)
    assert charts and any(c["texts"] for c in charts), "no chart text found"
    problems = []
    for chart in charts:
        where = f"chart {chart['index']}"
        if chart["canvas"]:
            problems.append(f"{where} is drawn on a canvas")
        for item in chart["texts"]:
            if item["text"].rstrip().endswith("…"):
                problems.append(f"{where}: {item['text']!r} is cut")
            slack = max(SLACK_EM * item["font_px"], 2.0)
            # A rotated text (a y title) runs along the vertical: its box ends where its first and last
            # letters do, with no empty em above them, so a box past the top or bottom cuts a letter.
            along = ("top", "bottom") if item.get("rotated") and len(item["text"]) > 2 else ()
            sides = [side for side in ("left", "right", "top", "bottom") if item[side] < -(1.0 if side in along else slack)]
            if sides:
                out = ", ".join(f"{s} {-item[s]:.1f} px" for s in sides)
                problems.append(f"{where}: {item['text']!r} ({item['font_px']:g} px font) lies outside the chart ({out})")
        if lang == "zh":
            english = untranslated(" | ".join(item["text"] for item in chart["texts"]))
            if english:
                problems.append(f"{where}: English in 中文: {english}")
    return problems


def reader_text(page) -> str:
    """The main area's text as a reader sees it, without the prompts and generated texts (the model's words)."""
    text = page.locator('[data-testid="stMain"]').inner_text()
    for testid in ("request-text", "request-prompt"):
        items = page.locator(f'[data-testid="{testid}"]')
        for i in range(items.count()):
            piece = items.nth(i).inner_text()
            if piece.strip():
                text = text.replace(piece, " ")
    return text


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_classroom_features_in_a_browser(tiny_llama_dir, tmp_path):
    """Unit switch, replay, a run saved and opened again without the model, a bad file, the projector
    layout, and every page in 中文 with no English UI text (tiny model: the UI, not the model, is under test)."""
    from visualize.i18n import untranslated

    in_browser(tiny_llama_dir, lambda page, sync_api, port, server: classroom(page, sync_api, port, server, tmp_path, untranslated),
               "failure_classroom.png", accept_downloads=True)


def in_browser(model_dir, drive, failure_png: str, **page_options) -> None:
    """Start the app on ``model_dir`` (None: the default model, as a user starts it), open it in chromium
    and run ``drive(page, sync_api, port, server)``; a failure leaves a full-page screenshot in SHOTS / ``failure_png``."""
    sync_api = pytest.importorskip("playwright.sync_api")
    SHOTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PAGEDATTENTION_LAB_MODEL"}
    if model_dir is not None:
        env["PAGEDATTENTION_LAB_MODEL"] = str(model_dir)
    server = start_server(port, env)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            page = browser.new_page(viewport={"width": 1440, "height": 2000}, **page_options)
            try:
                drive(page, sync_api, port, server)
            except Exception:
                page.screenshot(path=str(SHOTS / failure_png), full_page=True)
                raise
            browser.close()
    finally:
        server.kill()
        out, _ = server.communicate(timeout=30)
        print(out[-3000:] if out else "")


def classroom(page, sync_api, port, server, tmp_path, untranslated) -> None:
    open_app(page, sync_api, port, server)
    sidebar = page.locator('[data-testid="stSidebar"]')

    # MiB -> change -> blocks keeps the pool (it fell to 2 blocks). Tiny model: 8 KiB per block.
    sidebar.get_by_text("MiB", exact=True).click()
    mib = sidebar.get_by_role("spinbutton", name="KV pool (MiB)")
    mib.wait_for(timeout=180_000)
    mib.fill("0.25")
    mib.press("Enter")
    sidebar.get_by_text("32 blocks × 16", exact=False).wait_for(timeout=180_000)
    sidebar.get_by_text("blocks", exact=True).click()
    blocks = sidebar.get_by_role("spinbutton", name="KV pool (blocks)")
    blocks.wait_for(timeout=180_000)
    page.wait_for_timeout(1000)
    assert blocks.input_value() == "32"
    sidebar.get_by_text("32 blocks × 16", exact=False).wait_for(timeout=180_000)  # the engine took it
    blocks.fill("100000")  # out of range: said next to the box, and used as 512
    blocks.press("Enter")
    sidebar.get_by_text("100000 is outside 2–512, so 512 is used.").wait_for(timeout=180_000)
    sidebar.get_by_text("512 blocks × 16", exact=False).wait_for(timeout=180_000)
    blocks.fill("64")
    blocks.press("Enter")
    sidebar.get_by_text("64 blocks × 16", exact=False).wait_for(timeout=180_000)

    # Three steps, then the replay slider back to step 0.
    step = step_button(page)
    for k in range(3):
        step.click()
        step_title(page, f"Step {k}", 300)
    slider = page.locator('[data-testid="stSlider"]').filter(has_text="Replay: step").get_by_role("slider")
    slider.focus()
    page.keyboard.press("Home")
    step_title(page, "Step 0", 300)
    page.get_by_text("Showing step 0 of a run whose newest step is 2", exact=False).wait_for()
    step.click()
    step_title(page, "Step 3", 300)  # Step continues from the newest
    no_exception_box(page)
    wait_for_charts(page, 2)
    assert chart_text_problems(page, "en") == []  # the pool map and the memory chart

    # Save the whole run, reload (the session is gone), open it again: replayed without the model.
    saved = tmp_path / "run.json"
    download(page, "Download the whole run (JSON)", saved)
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Workload").click()
    download(page, "Download workload + settings (JSON)", tmp_path / "workload.json")
    page.reload()
    open_app(page, sync_api, port, server)
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Workload").click()
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(saved))
    page.get_by_text("Replaying the saved run", exact=False).wait_for(timeout=180_000)
    step_title(page, "Step 3", 300)
    page.locator('[data-testid="stVegaLiteChart"]').first.wait_for(timeout=180_000)
    no_exception_box(page)
    page.screenshot(path=str(SHOTS / "saved_run_en.png"), full_page=True)
    page.get_by_role("button", name="Close the saved run").click()
    step_button(page).wait_for(timeout=180_000)

    # A foreign file: a clear error next to the uploader, the app keeps working.
    panel = page.locator('[data-testid="stExpander"]').filter(has_text="Workload").first
    if panel.locator("details").get_attribute("open") is None:  # the rerun after Close folded it
        panel.locator("summary").click()
    foreign = tmp_path / "notebook.json"
    foreign.write_text('{"cells": []}')
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(foreign))
    page.get_by_text("This file cannot be opened: notebook.json: not a PagedAttention Lab workload file", exact=False).wait_for(timeout=180_000)
    no_exception_box(page)

    # Projector layout: the request texts are folded into an expander.
    page.get_by_text("projector", exact=True).click()
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Requests and their text").wait_for(timeout=180_000)
    step_button(page).click()
    step_title(page, "Step 0", 300)
    wait_for_charts(page, 2)
    assert chart_text_problems(page, "en") == []  # the large pool map
    page.screenshot(path=str(SHOTS / "projector_en.png"), full_page=True)
    page.get_by_text("desk", exact=True).click()

    # The compare page's real-engine run: two pool maps, two memory charts (their legends were cut,
    # "internal fragmentatio"), the concurrency lines.
    sidebar.get_by_role("link", name="Paged vs contiguous").click()
    page.get_by_role("button", name="Run both").click()
    page.get_by_role("heading", name="contiguous (max)", exact=True).wait_for(timeout=300_000)
    wait_for_charts(page, 5)
    no_exception_box(page)
    assert chart_text_problems(page, "en") == []
    page.screenshot(path=str(SHOTS / "compare_en.png"), full_page=True)
    sidebar.get_by_role("link", name="Live engine").click()
    step_button(page).wait_for(timeout=180_000)  # on the Live page before the language changes (a rerun of the page shown)

    # 中文: every page, no English UI text from the catalogue.
    sidebar.get_by_text("中文").click()
    page.get_by_role("button", name="单步", exact=True).wait_for(timeout=180_000)
    page.get_by_role("button", name="单步", exact=True).click()
    step_title(page, "第 1 步", 300)
    page.wait_for_timeout(800)
    assert untranslated(reader_text(page)) == [], untranslated(reader_text(page))
    wait_for_charts(page, 2)
    assert chart_text_problems(page, "zh") == []
    assert untranslated(sidebar.inner_text().replace("Language / 语言", "")) == []
    for name in ("分页 vs 连续", "内核实验", "课程"):
        sidebar.get_by_role("link", name=name).click()
        page.get_by_role("heading", name=name).first.wait_for(timeout=180_000)
        page.wait_for_timeout(1500)
        no_exception_box(page)
        assert untranslated(reader_text(page)) == [], (name, untranslated(reader_text(page)))
    sidebar.get_by_role("link", name="分页 vs 连续").click()
    page.get_by_text("模拟器（论文工作负载）").click()
    page.get_by_text("KV 显存浪费（论文图 2 风格）").wait_for(timeout=300_000)
    page.wait_for_timeout(1500)
    assert untranslated(reader_text(page)) == [], untranslated(reader_text(page))
    wait_for_charts(page, 4)  # two memory charts, the concurrency lines, latency against request rate
    assert chart_text_problems(page, "zh") == []
    page.screenshot(path=str(SHOTS / "compare_zh.png"), full_page=True)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_prefix_caching_in_a_browser(tiny_llama_dir):
    """The "Shared system prompt" preset in chromium: the request list says what the later requests found
    cached, and hovering a block the step hit shows its hash and its parent chain (tiny model)."""
    in_browser(tiny_llama_dir, prefix_caching, "failure_prefix.png")


def load_preset(page, name: str, last_request: str) -> None:
    """Open the Workload panel, load the classroom preset ``name``, wait for its ``last_request`` row
    in the request list, and fold the panel away again."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.locator('[data-testid="stExpander"] summary').filter(has_text="Workload").click()
    box = page.locator('[data-testid="stSelectbox"]').filter(has_text="Classroom preset")
    for attempt in range(4):  # on a busy machine the list may not open at the first click: open it again
        try:
            box.click()
            page.get_by_role("option", name=name).click(timeout=20_000)
            break
        except PlaywrightTimeout:
            if attempt == 3:
                raise
            page.keyboard.press("Escape")  # close a list that did open
    for attempt in range(2):  # a click that lands during a rerun can be dropped by Streamlit: once more
        page.get_by_role("button", name="Load preset").click()
        try:
            page.get_by_text(last_request, exact=True).first.wait_for(timeout=90_000)
            break
        except PlaywrightTimeout:
            if attempt == 1:
                raise
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Workload").click()


def prefix_caching(page, sync_api, port, server) -> None:
    from visualize.i18n import t

    open_app(page, sync_api, port, server)
    load_preset(page, t("preset_shared_system_prompt", "en"), "Request 3")
    step = step_button(page)
    cached = page.locator('[data-testid="request-cached"]').filter(has_text=re.compile(r"^[1-9]\d* tok cached"))
    for k in range(60):  # until requests 2 and 3 are admitted: they hit request 0's blocks
        step.click()
        step_title(page, f"Step {k}", 300)
        if cached.count():
            break
    assert cached.count() >= 1, "a later request found the system prompt cached"
    no_exception_box(page)
    page.wait_for_timeout(800)
    page.screenshot(path=str(SHOTS / "prefix_caching_en.png"), full_page=True)
    # Block 1, the second block of the system prompt, is a hit this step: hover its cell.
    pool = page.locator('[data-testid="stVegaLiteChart"]').first
    box = pool.bounding_box()
    tip = page.locator("#vg-tooltip-element")
    for y in (6, 9, 12, 16, 20):  # the legend below takes part of the height: find row 0
        pool.hover(position={"x": 5 + (box["width"] - 10) * 1.45 / 16, "y": y})
        tip.wait_for(state="visible", timeout=30_000)
        text = tip.inner_text()
        if re.match(r"Block\s+1\s", text):
            break
    assert t("block_hash", "en") in text and t("parent_chain", "en") in text, text
    assert re.search(r"block 0 · [0-9a-f]{8} ← start of the prompt", text), text


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_radix_tree_and_cpu_tier_in_a_browser(tiny_llama_dir):
    """The "Radix tree and CPU tier" preset, run in the browser to the step where the last question
    loads the system prompt back: the tree's nodes (text, lock count) and evicted blocks, the CPU
    tier's blocks and the matched prefix read from the page equal the same step's report of an engine
    run here, in English and in 中文 (tiny model)."""
    reports = radix_preset_reports(tiny_llama_dir)
    at = next(r.step for r in reports if r.kv_offload.copies_in)
    in_browser(tiny_llama_dir, lambda page, sync_api, port, server: radix_tree_and_tier(page, sync_api, port, server, reports[at]),
               "failure_radix.png")


def radix_preset_reports(model_dir) -> list:
    """Every step report of the preset on the engine the app builds for it (greedy, as the app's default)."""
    from app_pages.presets import PRESETS, preset_settings
    from app_pages.state import Settings, add_workload
    from engine import LLMEngine

    s = preset_settings("preset_radix_offload")
    llm = LLMEngine(Settings(model=str(model_dir), block_size=s["block_size"], num_gpu_blocks=s["num_blocks"], max_num_seqs=s["max_batch"],
                             enable_prefix_caching=True, prefix_cache=s["prefix_cache"], kv_offload_blocks=s["kv_offload_blocks"]).engine_config())
    add_workload(llm, PRESETS["preset_radix_offload"]["rows"], 0.0, 0, "none", 4, [])
    reports = []
    while llm.has_unfinished_requests():
        reports.append(llm.step())
    return reports


READ_PREFIX_VIEW_JS = """() => {
  const fresh = el => !el.closest('[data-stale="true"]');
  const all = sel => [...document.querySelectorAll(sel)].filter(fresh);
  const node = el => ({id: +el.dataset.nodeId, lock: +el.dataset.lockRef, blocks: el.dataset.blocks,
                       text: el.querySelector('[data-testid="radix-node-text"]').textContent,
                       meta: el.querySelector('[data-testid="radix-node-meta"]').textContent});
  return {nodes: all('[data-testid="radix-node"]').map(node), evicted: all('[data-testid="radix-evicted"]').map(node),
          tier: all('[data-testid="cpu-tier-block"]').map(el => [+el.dataset.block, el.dataset.state,
                     el.querySelector('[data-testid="cpu-tier-mark"]').textContent]),
          matches: all('[data-testid="prefix-match"]').map(el => [+el.dataset.cached, +el.dataset.loaded])};
}"""


def radix_tree_and_tier(page, sync_api, port, server, report) -> None:
    from visualize.i18n import t
    from visualize.radix import shorten, visible

    open_app(page, sync_api, port, server)
    load_preset(page, t("preset_radix_offload", "en"), "Request 3")
    page.get_by_label("N", exact=True).fill(str(report.step + 1))
    page.get_by_role("button", name="Run N steps").click()
    step_title(page, f"Step {report.step}", 300)
    tier = report.kv_offload
    want_tier = sorted([b, "loaded" if b in {c for c, _ in tier.copies_in} else "offloaded" if b in {c for _, c in tier.copies_out}
                        else "held" if b in tier.cpu_held else "empty"] for b in range(tier.cpu_capacity))
    for lang in ("en", "zh"):
        if lang == "zh":
            page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
            step_title(page, t("step_summary", "zh", step=report.step), 120)
        page.get_by_text(t("radix_tree_title", lang), exact=True).wait_for(timeout=60_000)
        seen = page.evaluate(READ_PREFIX_VIEW_JS)
        nodes = {n.node_id: n for n in report.radix_tree.nodes}
        assert sorted(n["id"] for n in seen["nodes"]) == sorted(nodes)
        for n in seen["nodes"]:
            want = nodes[n["id"]]
            assert (n["text"], n["lock"], n["blocks"]) == (shorten(visible(want.text)), want.lock_ref, " ".join(map(str, want.blocks)))
            assert n["meta"] == t("radix_node_meta", lang, blocks=", ".join(map(str, want.blocks)), lock=want.lock_ref,
                                  step=want.last_access_step)
        assert sorted((n["id"], n["text"]) for n in seen["evicted"]) == sorted((n.node_id, shorten(visible(n.text)))
                                                                               for n in report.radix_tree.evicted)
        assert seen["evicted"], "the step evicted a path"
        assert sorted(b[:2] for b in seen["tier"]) == want_tier
        assert {m for _, _, m in seen["tier"] if m} == {f"↑{g}" for _, g in tier.copies_in} | {f"↓{g}" for g, c in tier.copies_out
                                                                                                  if c not in {c for c, _ in tier.copies_in}}
        match = report.prefix_matches[3]
        assert [match.num_cached_tokens, match.num_loaded_tokens] in seen["matches"] and match.num_loaded_tokens > 0
        page.get_by_text(t("cpu_tier_title", lang, held=len(tier.cpu_held), capacity=tier.cpu_capacity), exact=True).wait_for()
        no_exception_box(page)
        page.screenshot(path=str(SHOTS / f"radix_offload_{lang}.png"), full_page=True)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_swap_lane_in_a_browser(default_model_dir):
    """The "Small pool, swap preemption" preset with the default model (its stories are the README's
    screenshot): Step until requests are swapped out; the CPU swap space is drawn as a second pool map,
    the queues name the swapped requests, and no chart text is cut, in English and in 中文."""
    in_browser(None, swap_lane, "failure_swap.png")  # the fixture has fetched the default model


def swap_lane(page, sync_api, port, server) -> None:
    from visualize.i18n import t

    open_app(page, sync_api, port, server)
    load_preset(page, t("preset_swap", "en"), "Request 5")
    step = step_button(page)
    copied_out = page.get_by_text(re.compile(r"This step: [1-9]\d* block\(s\) out"))
    for k in range(40):  # the preset's pool fills at about step 12: requests are swapped out
        step.click()
        step_title(page, f"Step {k}", 300)
        # The CPU lane's caption is drawn a moment after the step's title: once the rerun has drawn
        # everything (no element of the previous run left, marked data-stale), it is there or not at all.
        page.wait_for_function("() => !document.querySelector('[data-stale=\"true\"]')", timeout=300_000)
        try:
            copied_out.wait_for(timeout=300)
            break
        except sync_api.TimeoutError:
            pass
    assert copied_out.count() == 1, "no block was swapped out"
    page.get_by_text(re.compile(r"· swapped: request ids? \d")).wait_for()  # the queues name the swapped requests
    page.get_by_text(t("cpu_pool", "en"), exact=True).wait_for()
    wait_for_charts(page, 3)  # the GPU pool, the CPU swap space, the memory chart
    no_exception_box(page)
    assert chart_text_problems(page, "en") == []
    page.screenshot(path=str(SHOTS / "swap_en.png"), full_page=True)
    page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
    page.get_by_text(t("cpu_pool", "zh"), exact=True).wait_for(timeout=180_000)
    page.get_by_text(re.compile(r"已换出：请求 id \d")).wait_for(timeout=180_000)
    wait_for_charts(page, 3)
    no_exception_box(page)
    assert chart_text_problems(page, "zh") == []
    page.screenshot(path=str(SHOTS / "swap_zh.png"), full_page=True)


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_beam_tree_in_a_browser(tiny_llama_dir):
    """Beam search (sidebar, memory sharing): the beam trees drawn after a few steps, with no chart
    text cut or outside its chart, in English and in 中文 (tiny model)."""
    in_browser(tiny_llama_dir, beam_trees, "failure_beam.png")


def beam_trees(page, sync_api, port, server) -> None:
    from visualize.i18n import t

    open_app(page, sync_api, port, server)
    sidebar = page.locator('[data-testid="stSidebar"]')
    sidebar.get_by_text(t("sharing_beam", "en"), exact=True).click()
    sidebar.get_by_role("spinbutton", name=t("sharing_width_beam", "en")).wait_for(timeout=180_000)
    step = step_button(page)
    step.wait_for(timeout=180_000)
    trees = page.get_by_text(re.compile(rf"^{t('beam_tree_title', 'en')} · "))
    for k in range(6):  # beams fork again after the prompt's prefill: trees from the second fork on
        step.click()
        step_title(page, f"Step {k}", 300)
    trees.first.wait_for(timeout=60_000)
    charts = 2 + trees.count()  # the pool map, the memory chart, a tree per request
    wait_for_charts(page, charts)
    no_exception_box(page)
    assert chart_text_problems(page, "en") == []
    sidebar.get_by_text("中文").click()
    page.get_by_text(re.compile(rf"^{t('beam_tree_title', 'zh')} · ")).first.wait_for(timeout=180_000)
    wait_for_charts(page, charts)
    no_exception_box(page)
    assert chart_text_problems(page, "zh") == []


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_every_page_opens_by_its_url_and_the_simulator_charts_keep_their_text(tiny_llama_dir):
    """A link to any page (/live, /compare, /vllm, /kernel, /lessons) opens that page, not "Page not found";
    and the Paged vs contiguous page's simulator charts, at the default width, cut none of their text,
    nor its metrics and widgets theirs (in English and 中文)."""
    in_browser(tiny_llama_dir, pages_by_url, "failure_pages_by_url.png")


def pages_by_url(page, sync_api, port, server) -> None:
    from visualize.i18n import t

    open_app(page, sync_api, port, server)
    for path, title in (("live", "app_title"), ("compare", "page_compare"), ("vllm", "page_vllm"), ("kernel", "page_kernel"),
                        ("lessons", "page_lessons")):
        page.goto(f"http://127.0.0.1:{port}/{path}", timeout=60_000)
        page.get_by_role("heading", name=t(title, "en"), exact=True).first.wait_for(timeout=180_000)
        page.wait_for_timeout(500)
        assert page.get_by_text("Page not found").count() == 0, path
        no_exception_box(page)
    page.goto(f"http://127.0.0.1:{port}/compare", timeout=60_000)
    page.get_by_text(t("source_sim", "en"), exact=True).click()
    wait_for_charts(page, 3)  # the two memory charts and concurrent requests (the latency sweep may still run)
    no_exception_box(page)
    assert chart_text_problems(page, "en") == []
    assert widget_text_problems(page) == []  # the metric labels and the scheduler's choice, whole
    page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
    page.get_by_text(t("sched_rule", "zh"), exact=True).first.wait_for(timeout=180_000)
    wait_for_charts(page, 3)
    no_exception_box(page)
    assert widget_text_problems(page) == []


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_beside_vllm_in_a_browser(default_model_dir):
    """The "Beside real vLLM" page: the lab's engine run on the first recorded replay's workload,
    its three step charts beside vLLM's, with no chart text cut or outside its chart, in English and
    in 中文 (the default model, as the replay was recorded with it)."""
    in_browser(None, beside_vllm, "failure_vllm.png")


def beside_vllm(page, sync_api, port, server) -> None:
    from visualize.i18n import t

    open_app(page, sync_api, port, server)
    page.locator('[data-testid="stSidebar"]').get_by_role("link", name=t("page_vllm", "en")).click()
    page.get_by_role("button", name=t("vllm_run_lab", "en")).click()
    page.get_by_text(t("vllm_running_title", "en")).first.wait_for(timeout=300_000)
    wait_for_charts(page, 3)  # running requests, KV cache usage, preemptions
    no_exception_box(page)
    assert chart_text_problems(page, "en") == []
    page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
    page.get_by_text(t("vllm_running_title", "zh")).first.wait_for(timeout=300_000)
    wait_for_charts(page, 3)
    no_exception_box(page)
    assert chart_text_problems(page, "zh") == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_test_process_takes_its_app_server_with_it():
    # A pytest killed mid-run (a CI time-out, Ctrl-\\) runs no teardown: its Streamlit server must not live on.
    port = free_port()
    script = ("import os, sys, time; sys.path.insert(0, 'tests'); from test_app_browser import start_server; "
              f"server = start_server({port}, dict(os.environ)); print(server.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    server_pid = int(parent.stdout.readline())
    deadline = time.time() + 120
    while time.time() < deadline:  # up and serving: it has printed its start-up lines and goes quiet
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    assert _alive(server_pid)
    time.sleep(1)
    parent.kill()
    parent.wait(timeout=30)
    deadline = time.time() + 30
    while _alive(server_pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(server_pid), "the app server outlived the killed test process"


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_shared_blocks_are_drawn_as_shared_not_as_copies_in_a_browser(tiny_llama_dir):
    """Parallel sampling, after the prompts' prefill and the forks (no copy-on-write yet): the browser
    draws a shared block's cell in the block tables with a dotted slate border, and the legend beside
    it explains that border and no pink one, in English and in 中文 (tiny model)."""
    in_browser(tiny_llama_dir, shared_block_borders, "failure_shared_blocks.png")


def shared_block_borders(page, sync_api, port, server) -> None:
    from visualize.colors import SHARED_COLOR
    from visualize.i18n import t

    slate = "rgb({}, {}, {})".format(*(int(SHARED_COLOR[i : i + 2], 16) for i in (1, 3, 5)))
    open_app(page, sync_api, port, server)
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Workload").click()
    page.get_by_role("button", name="Load preset").wait_for()
    page.locator('[data-testid="stSelectbox"]').filter(has_text="Classroom preset").click()
    page.get_by_role("option", name=t("preset_parallel_sampling", "en")).click()
    page.get_by_role("button", name="Load preset").click()
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Workload").click()
    step = step_button(page)
    step.wait_for(timeout=180_000)
    step.click()
    step_title(page, "Step 0", 300)
    for lang in ("en", "zh"):
        if lang == "zh":
            page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
            step_title(page, "第 0 步", 300)
        cells = page.locator('[data-testid="block-table-cell"]')
        cells.first.wait_for(timeout=60_000)
        shared = [c for c in cells.all() if re.search(r" [2-9]$", c.get_attribute("title") or "")]
        assert shared, "the samples share their prompt's blocks"
        for cell in shared:
            style = cell.evaluate("e => { const s = getComputedStyle(e); return [s.borderTopStyle, s.borderTopColor]; }")
            assert style == ["dotted", slate], (lang, cell.get_attribute("title"), style)
            assert re.search(r"×[2-9]", cell.inner_text())
        legend = page.locator('[data-testid="pool-legend"]').inner_text()
        assert t("legend_shared", lang) in legend and t("legend_cow_dst", lang) not in legend, legend
        no_exception_box(page)
        assert widget_text_problems(page) == [], lang  # the step's metrics ("Preemptions this step") whole


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_a_file_over_the_upload_limit_is_explained_under_the_uploader(tiny_llama_dir, tmp_path):
    """The browser refuses a file over server.maxUploadSize before sending it (the app never sees it):
    the line under the uploader says the limit and what that refusal looks like, in English and 中文."""
    big = tmp_path / "session.json"
    big.write_bytes(b'{"format": "pagedattention-lab/run", "pad": "' + b"x" * (9 << 20) + b'"}')
    in_browser(tiny_llama_dir, lambda *args: upload_refusal(*args, big), "failure_upload_refusal.png")


def upload_refusal(page, sync_api, port, server, big) -> None:
    from app_pages.common import MAX_UPLOAD_MB
    from visualize.i18n import t

    open_app(page, sync_api, port, server)
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Workload").click()
    uploader = page.locator('[data-testid="stFileUploader"]').filter(has_text=t("open_file", "en"))
    uploader.locator('input[type="file"]').set_input_files(str(big))
    page.get_by_text(re.compile(rf"{MAX_UPLOAD_MB}(\.0)? ?MB or smaller")).wait_for(timeout=60_000)  # Streamlit's chip
    page.get_by_text(t("uploader_words", "en", mb=MAX_UPLOAD_MB), exact=True).first.wait_for(timeout=10_000)
    page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
    words = page.get_by_text(t("uploader_words", "zh", mb=MAX_UPLOAD_MB), exact=True).first
    words.wait_for(state="attached", timeout=180_000)
    if not words.is_visible():  # the expander, renamed, may have folded
        page.locator('[data-testid="stExpander"] summary').filter(has_text=t("workload", "zh")).click()
    words.wait_for(timeout=30_000)
    no_exception_box(page)
