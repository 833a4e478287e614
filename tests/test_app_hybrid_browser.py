"""The app in a real browser on a hybrid model: the Gemma 3 preset (Gemma 3 270M, the extra "gemma") steps
past its sliding window, and the page's KV cache groups show five sliding-window groups that freed their
blocks out of the window (∅ entries, at most a window's blocks in use) beside a full-attention group that
kept them all; the pool map colours every group's blocks as the groups view does and marks the null block;
the events say each freed block left the window, with its group; ∅ is defined as the reserved block 0; in
English and in 中文. Helpers from tests/test_app_browser.py."""

from __future__ import annotations

import os
import re
import time

import pytest

from test_app_browser import SHOTS, CHROMIUM, no_exception_box, open_app, start_server, step_button, step_title, free_port

# Every chart's rect fills (Vega draws a cell as a path with a fill) and its texts, in page order.
CHART_FILLS_JS = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg')].map(svg => ({
    fills: [...svg.querySelectorAll('.mark-rect path')].map(p => p.getAttribute('fill')),
    texts: [...svg.querySelectorAll('text')].map(t => t.textContent)}))"""

pytestmark = pytest.mark.slow


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_the_gemma_preset_shows_each_groups_block_table(gemma_loaded):
    sync_api = pytest.importorskip("playwright.sync_api")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PAGEDATTENTION_LAB_MODEL"}
    server = start_server(port, env)
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            open_app(page, sync_api, port, server)
            page.locator('[data-testid="stExpander"] summary').filter(has_text="Workload").click()
            page.locator('[data-testid="stSelectbox"]').filter(has_text="Classroom preset").click()
            page.get_by_role("option", name="Gemma 3: sliding-window blocks freed").click()
            page.get_by_role("button", name="Load preset").click()
            page.get_by_text("Request 0", exact=True).first.wait_for(timeout=300_000)  # Gemma loaded, the engine rebuilt
            for n in range(2):  # the prefill, then the first decode frees the blocks out of the window
                step_button(page).wait_for(timeout=300_000)
                step_button(page).click()
                step_title(page, f"Step {n}", timeout_s=300)
                if n == 0:  # the preset's note gives the prompt's length the prefill computed
                    processed = page.locator('[data-testid="stMetric"]').filter(has_text="Tokens processed")
                    tokens = processed.locator('[data-testid="stMetricValue"]').inner_text()
                    assert page.get_by_text(f"on a {tokens}-token prompt, past its 512-token sliding window").count() == 1, tokens
            groups = page.locator('[data-testid="kv-group"]')
            groups.nth(5).wait_for(timeout=60_000)
            no_exception_box(page)
            heads, in_use, nulls, cells = _block_tables_once_drawn(page)
            assert len(heads) == 6 and all("sliding window 512" in h for h in heads[:5]) and "full attention" in heads[5], heads
            assert all(re.search(r"layers \d+, \d+, \d+", h) for h in heads), heads
            assert in_use[5] == cells[5] and nulls[5] == 0, "the full-attention group keeps every block"
            assert all(u <= 33 and n > 0 and u + n == c for u, n, c in zip(in_use[:5], nulls[:5], cells[:5])), (in_use, nulls, cells)
            assert page.get_by_text(re.compile(r"the window saves \d+ blocks")).count() == 1
            # The preset chose the sidebar's own Gemma 3 option, not a local path that names it.
            assert page.get_by_role("radio", name=re.compile(r"^Gemma 3 270M")).is_checked()
            # Each group's colour is a swatch beside its heading; the heading itself is dark text (the pale
            # greens and blues of groups 3 and 4 were unreadable as text on white).
            swatches = [groups.nth(i).locator('[data-testid="kv-group-swatch"]').evaluate("e => getComputedStyle(e).backgroundColor")
                        for i in range(6)]
            assert len(set(swatches)) == 6, swatches
            head_colors = [groups.nth(i).locator("b").evaluate("e => getComputedStyle(e).color") for i in range(6)]
            assert all(_luminance(c) < 0.2 for c in head_colors), head_colors
            # The pool map (the chart whose cells are numbered, block 0 marked ∅) has every group's colour, as
            # many cells of each as the group holds blocks, and the legend under it names every group.
            group_fills = [_hex(c) for c in swatches]
            pool = _pool_map(page)
            assert pool["texts"][0] == "∅", pool["texts"][:3]
            counts = [sum(1 for f in pool["fills"] if f == c) for c in group_fills]
            assert all(n >= u for n, u in zip(counts, in_use)), (counts, in_use)  # each cell is drawn pale and its filled part solid
            legend = page.locator('[data-testid="pool-legend"]').inner_text()
            assert all(h.split(" · layers")[0].split(" · ")[0] in legend for h in heads) and "null block (∅)" in legend, legend
            # The events: every block freed this step left the sliding window, named with its group.
            cells = _event_cells(page)
            window = [c for c in cells if re.fullmatch(r"block \d+ \(group [0-4], logical \d+\) freed: every token in it is before "
                                                        r"the last 512 tokens, .* now points at the null block 0", c)]
            assert cells.count("free") == len(window) >= 5 and not any("still held by others" in c for c in cells), cells
            caption = "∅: the null block, block 0 of the pool, reserved and never allocated"
            assert page.get_by_text(caption, exact=False).count() == 1
            page.screenshot(path=str(SHOTS / "gemma_hybrid_en.png"), full_page=True)
            # 中文: the same views in the reader's language.
            page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
            step_title(page, "第 1 步", timeout_s=120)
            page.locator('[data-testid="kv-group"]').nth(5).wait_for(timeout=60_000)
            no_exception_box(page)
            assert page.get_by_text("∅：空块（null block），即块池中的块 0，它被预留、从不分配", exact=False).count() == 1
            cells = _event_cells(page)
            for _ in range(60):  # the grid keeps the English rows' text until its rerun in 中文 has drawn
                if "释放" in cells:
                    break
                page.wait_for_timeout(1000)
                cells = _event_cells(page)
            assert cells.count("释放") == sum("即滑动窗口之外" in c for c in cells) >= 5 and not any("其他序列仍持有" in c for c in cells)
            assert "空块（null block，∅）" in page.locator('[data-testid="pool-legend"]').inner_text()
            assert [_hex(c) for c in [groups.nth(i).locator('[data-testid="kv-group-swatch"]').evaluate(
                "e => getComputedStyle(e).backgroundColor") for i in range(6)]] == group_fills
            page.screenshot(path=str(SHOTS / "gemma_hybrid_zh.png"), full_page=True)
            browser.close()
    finally:
        server.kill()
        server.wait(timeout=30)


def _block_tables_once_drawn(page, timeout_s: float = 30.0) -> tuple[list[str], list[int], list[int], list[int]]:
    """Each KV cache group's heading, blocks in use (``data-in-use``), ∅ cells and cells, read in one
    pass over the page; read again until the tables agree with their own counts (a group's cells are its
    blocks in use and its null entries) or ``timeout_s`` passes. Streamlit redraws the groups one by one
    after a step: separate reads can mix the step before with the step after."""
    read = """() => [...document.querySelectorAll('[data-testid="kv-group"]')].map(g => {
        const cells = [...g.querySelectorAll('[data-testid="kv-group-cell"]')];
        return [g.querySelector("b").innerText, Number(g.getAttribute("data-in-use")),
                cells.filter(c => c.innerText.includes("∅")).length, cells.length];
    })"""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = page.evaluate(read)
        if all(used + null == n for _, used, null, n in rows) or time.monotonic() > deadline:
            return tuple(list(column) for column in zip(*rows)) if rows else ([], [], [], [])
        page.wait_for_timeout(250)


def _luminance(css_rgb: str) -> float:
    """WCAG relative luminance (0 black .. 1 white) of a CSS ``rgb(r, g, b)`` colour."""
    channels = [int(x) / 255 for x in re.findall(r"\d+", css_rgb)[:3]]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def _hex(css_rgb: str) -> str:
    return "#" + "".join(f"{int(x):02x}" for x in re.findall(r"\d+", css_rgb)[:3])


def _pool_map(page) -> dict:
    """The pool map's fills and texts: the chart whose first text is a block label (∅ or 0) followed by 1, 2."""
    for _ in range(60):
        charts = page.evaluate(CHART_FILLS_JS)
        pools = [c for c in charts if c["texts"][:1] in (["∅"], ["0"]) and c["texts"][1:3] == ["1", "2"]]
        if pools:
            return pools[0]
        time.sleep(1)
    raise AssertionError(f"no pool map among {[c['texts'][:3] for c in charts]}")


def _event_cells(page) -> list[str]:
    """The events table's cells' texts: the grid draws on a canvas and keeps the text of the rows it
    shows in an accessible table behind it."""
    grid = page.locator('[data-testid="stDataFrame"]').last
    grid.scroll_into_view_if_needed()
    cells = grid.locator('[role="gridcell"]')
    cells.first.wait_for(state="attached", timeout=60_000)
    return [c.strip() for c in cells.all_text_contents()]
