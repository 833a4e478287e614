"""The what-if page in a real browser (Debian's chromium through Playwright), in English and 中文: the
numbers a reader reads (KV bytes per token, the paper's token slots) and the charts' labels and data."""

from __future__ import annotations

import re
import time

import pytest

from tests.test_app_browser import CHROMIUM, SHOTS, chart_text_problems, in_browser, no_exception_box, wait_for_charts
from visualize.i18n import t, untranslated

pytestmark = pytest.mark.slow

PAPER_SLOTS = 15_700  # PagedAttention Table 1: OPT-13B on one A100-40GB


def metric(page, label: str) -> str:
    """The value of the metric whose label is ``label``, as shown."""
    box = page.locator('[data-testid="stMetric"]').filter(has=page.get_by_text(label, exact=True))
    return box.locator('[data-testid="stMetricValue"]').first.inner_text().strip()


def number(text: str) -> float:
    return float(re.sub(r"[^\d.]", "", text.split()[0]))


def prose(page) -> str:
    """The main area's text without its code (the simulator call and the command, which are Python and shell)."""
    return page.evaluate("""() => { const main = document.querySelector('[data-testid="stMain"]').cloneNode(true);
        main.querySelectorAll('code').forEach(c => c.remove()); document.body.appendChild(main);
        const text = main.innerText; main.remove(); return text; }""")


def choose(page, label: str, option: str) -> None:
    page.locator('[data-testid="stMain"] [data-testid="stSelectbox"]').filter(has_text=label).click()
    page.get_by_role("option", name=option, exact=True).click()


def bar_labels(page) -> list[str]:
    """The texts of the first chart (paged vs contiguous bars): axis labels, bar values, titles."""
    return page.evaluate("""() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')][0]
        ? [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')[0].querySelectorAll('svg text')].map(x => x.textContent)
        : []""")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_whatif_page_in_a_browser():
    in_browser(None, whatif, "failure_whatif.png")


def whatif(page, sync_api, port, server) -> None:
    deadline = time.time() + 120
    while True:
        try:
            page.goto(f"http://127.0.0.1:{port}/whatif", timeout=10_000)
            break
        except sync_api.Error:
            if time.time() > deadline or server.poll() is not None:
                raise
            time.sleep(0.5)
    page.get_by_role("heading", name=t("page_whatif", "en"), exact=True).wait_for(timeout=300_000)
    wait_for_charts(page, 2)
    no_exception_box(page)
    # Llama-3-8B in bf16 (the default): 2 x 32 layers x 8 KV heads x 128 x 2 bytes.
    assert metric(page, t("whatif_kv_per_token", "en")) == "131,072 B"
    assert "2 × 32 layers × 8 KV heads × 128 (head_dim) × 2 B" in page.locator('[data-testid="stMain"]').inner_text()
    fit = metric(page, t("whatif_fit", "en"))  # the paged allocator's, the default choice
    labels = bar_labels(page)
    assert {t("system_paged", "en"), "contiguous (Max)", "contiguous (Pow2)", "contiguous (Oracle)"} <= set(labels), labels
    assert fit in labels, (fit, labels)  # the bar's value label is the metric's number
    assert t("whatif_fit_axis", "en") in labels and t("whatif_rate_axis", "en") in labels
    assert chart_text_problems(page, "en") == []

    choose(page, t("whatif_model", "en"), "OPT-13B")
    choose(page, t("whatif_gpu", "en"), "A100-40GB")
    page.wait_for_function("s => document.body.innerText.includes(s)", arg=f"{2 * 40 * 40 * 128 * 2:,} B", timeout=60_000)
    page.wait_for_timeout(1500)
    slots = number(metric(page, t("whatif_kv_slots", "en")))
    assert abs(slots / PAPER_SLOTS - 1) < 0.05, slots
    timing = re.search(r"Computed in (\d+) ms", page.locator('[data-testid="stMain"]').inner_text())
    page.screenshot(path=str(SHOTS / "whatif_en.png"), full_page=True)
    print(f"what-if page: computed in {timing.group(1)} ms after a change (goal < 500 ms)")

    page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
    page.get_by_role("heading", name=t("page_whatif", "zh"), exact=True).wait_for(timeout=60_000)
    wait_for_charts(page, 2)
    no_exception_box(page)
    assert number(metric(page, t("whatif_kv_slots", "zh"))) == slots  # the choices survived the language switch
    assert metric(page, t("whatif_kv_per_token", "zh")) == "819,200 B"
    labels = bar_labels(page)
    assert {t("system_paged", "zh"), "连续（Max）", "连续（Oracle）"} <= set(labels), labels
    assert t("whatif_fit_axis", "zh") in labels
    text = page.locator('[data-testid="stMain"]').inner_text()
    assert "1.57 万" in text  # the paper check, in 中文
    assert "2 × 40 层 × 40 个 KV 头 × 128（head_dim）× 2 B" in text
    assert untranslated(prose(page)) == []
    assert chart_text_problems(page, "zh") == []
    page.screenshot(path=str(SHOTS / "whatif_zh.png"), full_page=True)
