"""The per-request timeline in a real browser (Debian's chromium through Playwright): the head-of-line
preset run to its end on the Live page, its rows read from the chart, a request's TTFT read from the
page and checked against the step reports of the run the page saves, in English and in 中文."""

from __future__ import annotations

import json

import pytest

from tests.test_app_browser import CHROMIUM, SHOTS, chart_text_problems, download, in_browser, no_exception_box, open_app, wait_for_charts

pytestmark = pytest.mark.slow

# Each chart's texts (the app draws charts as SVG), to find the timeline's among them.
CHART_TEXTS_JS = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')].map(
  chart => [...chart.querySelectorAll('svg text')]
    .filter(t => getComputedStyle(t).visibility !== 'hidden' && +getComputedStyle(t).opacity !== 0)
    .map(t => t.textContent))"""
ROWS = 7  # the preset: one long prompt, six short ones


def timeline_rows(page, lang: str) -> list[str]:
    """The timeline chart's row labels, top to bottom (the chart whose legend names the waiting state)."""
    waiting, label = ("waiting", "Request") if lang == "en" else ("等待", "请求")
    charts = [texts for texts in page.evaluate(CHART_TEXTS_JS) if waiting in texts]
    assert len(charts) == 1, charts
    return [text for text in charts[0] if text.startswith(label + " ")]


def ttft_from_reports(steps, request_id: int) -> float:
    """TTFT as bench-serve defines it, from the reports alone: the end of the first step that gave the
    request a token, less its arrival, on the engine's clock (each step lasts its timings_ms["total"])."""
    arrival = next(r.arrived[request_id] for r in steps if request_id in r.arrived)
    first = next(i for i, r in enumerate(steps) if r.new_token_ids.get(request_id))
    return steps[0].start_ms + sum(r.timings_ms["total"] for r in steps[: first + 1]) - arrival


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_the_head_of_line_timeline_in_a_browser(tiny_llama_dir, tmp_path):
    in_browser(tiny_llama_dir, lambda page, sync_api, port, server: drive(page, sync_api, port, server, tmp_path),
               "failure_timeline.png", accept_downloads=True)


def drive(page, sync_api, port, server, tmp_path) -> None:
    from engine.runfile import load_run

    open_app(page, sync_api, port, server)
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Workload").click()
    page.locator('[data-testid="stSelectbox"]').filter(has_text="Classroom preset").click()
    page.get_by_role("option", name="Head-of-line blocking, chunked prefill").click()
    page.get_by_role("button", name="Load preset").click()
    page.get_by_text(f"Request {ROWS - 1}", exact=True).wait_for(timeout=180_000)
    page.locator('[data-testid="stExpander"] summary').filter(has_text="Workload").click()
    main = page.locator('[data-testid="stMain"]')
    box = main.locator('[data-testid="stNumberInput"] input').first
    box.fill("80")
    box.press("Enter")
    page.wait_for_timeout(500)
    main.get_by_role("button", name="Run N steps").click()
    page.get_by_text("All requests finished.", exact=False).wait_for(timeout=300_000)
    no_exception_box(page)

    saved = tmp_path / "run.json"
    download(page, "Download the whole run (JSON)", saved)
    steps = load_run(saved).steps
    trace = tmp_path / "trace.json"
    download(page, "Download the timeline as a trace (Chrome / Perfetto JSON)", trace)
    threads = {e["tid"] for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert threads == set(range(ROWS))

    expected = ttft_from_reports(steps, 1)  # the first short request, behind the long prompt's chunks
    assert expected > ttft_from_reports(steps, 0) > 0
    for lang in ("en", "zh"):
        if lang == "zh":
            page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
            page.get_by_role("button", name="单步", exact=True).wait_for(timeout=180_000)
            page.get_by_text("请求时间线").first.wait_for(timeout=180_000)
        wait_for_charts(page, 3)
        label = "Request" if lang == "en" else "请求"
        assert timeline_rows(page, lang) == [f"{label} {i}" for i in range(ROWS)], lang
        cell = page.locator('[data-testid="timeline-latency"] tr[data-request="1"] td[data-metric="ttft_ms"]')
        assert float(cell.inner_text()) == pytest.approx(expected, abs=0.051), lang
        waited = page.locator('[data-testid="timeline-latency"] tr[data-request="1"] td[data-metric="ttft_steps"]')
        assert int(waited.inner_text()) > 1, lang  # it waited behind the long prompt's chunks
        assert chart_text_problems(page, lang) == [], lang
        no_exception_box(page)
        chart = page.locator('[data-testid="stVegaLiteChart"]').filter(has_text="等待" if lang == "zh" else "waiting")
        chart.scroll_into_view_if_needed()
        page.wait_for_timeout(500)
        chart.screenshot(path=str(SHOTS / f"timeline_{lang}.png"))
