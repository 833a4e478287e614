"""The what-if page in a real browser (Debian's chromium through Playwright), in English and 中文: the
numbers a reader reads (KV bytes per token, the paper's token slots, Llama-3-70B refused on one H100 with
what would fit, then split over 8 H100s) and the charts' labels and data."""

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
    """Pick ``option`` in the selectbox labelled exactly ``label`` ("GPU", not "GPUs (tensor parallelism)")."""
    box = page.locator('[data-testid="stMain"] [data-testid="stSelectbox"]').filter(
        has=page.locator('[data-testid="stWidgetLabel"]').get_by_text(label, exact=True))
    box.click()
    page.get_by_role("option", name=option, exact=True).click()


def main_text(page) -> str:
    return page.locator('[data-testid="stMain"]').inner_text()


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
    assert "2 × 40 层 × 40 个 KV 头 × 每头维数 128 × 2 B" in text
    assert "0.9 × 40.00 GiB − 权重 23.93 GiB = 12.07 GiB" in text  # one unit: 36 − 23.93 = 12.07, as a student checks
    assert untranslated(prose(page)) == []
    assert chart_text_problems(page, "zh") == []
    page.screenshot(path=str(SHOTS / "whatif_zh.png"), full_page=True)

    # Llama-3-70B on one H100: the weights do not fit, and the page says what would.
    choose(page, t("whatif_gpu", "zh"), "H100-SXM-80GB")
    page.wait_for_function("s => document.body.innerText.includes(s)", arg="H100-SXM-80GB：", timeout=60_000)
    choose(page, t("whatif_model", "zh"), "Llama-3-70B")
    page.wait_for_function("s => document.body.innerText.includes(s)", arg="这样就放得下：2 块 H100-SXM-80GB（张量并行）、fp8 权重。",
                           timeout=60_000)
    no_exception_box(page)
    assert metric(page, t("whatif_kv_memory", "zh")) == t("whatif_kv_memory_none", "zh")  # not a negative memory
    # Split over 8 H100s (tensor parallelism): by hand, 0.9 x 79.65 GiB - 16.44 GiB per GPU = 55.25 GiB each,
    # / 40,960 B per token per GPU = 1,448,211 slots; 1,885 requests of 768 tokens.
    choose(page, t("whatif_tp", "zh"), "8")
    page.wait_for_function("s => document.body.innerText.includes(s)", arg="1,448,211", timeout=60_000)
    wait_for_charts(page, 2)
    no_exception_box(page)
    assert metric(page, t("whatif_kv_slots", "zh")) == "1,448,211"
    assert metric(page, t("whatif_kv_memory", "zh")) == "441.96 GiB"
    assert metric(page, t("whatif_fit", "zh")) == "1,885"
    assert "8 块 GPU × （0.9 × 79.65 GiB − 每块的权重 16.44 GiB）= 441.96 GiB" in main_text(page)
    assert untranslated(prose(page)) == [] and chart_text_problems(page, "zh") == []

    page.locator('[data-testid="stSidebar"]').get_by_text("English").click()  # the choices survive the switch back
    page.get_by_role("heading", name=t("page_whatif", "en"), exact=True).wait_for(timeout=60_000)
    wait_for_charts(page, 2)
    assert metric(page, t("whatif_kv_slots", "en")) == "1,448,211" and metric(page, t("whatif_weights", "en")) == "131.50 GiB"
    text = main_text(page)
    assert "70.6B parameters × 2 B = 131.50 GiB, ÷ 8 GPUs = 16.44 GiB per GPU" in text
    assert "2 × 80 layers × 1 KV heads per GPU × 128 (head_dim) × 2 B × 8 GPUs" in text
    ridge = metric(page, t("whatif_ridge", "en"))  # counted with each request's KV at 640 tokens: 625, not the weights' 296
    assert ridge == "625", ridge
    page.screenshot(path=str(SHOTS / "whatif_70b_8_gpus_en.png"), full_page=True)
