"""The app in a real browser on a hybrid model: the Gemma 3 preset (Gemma 3 270M, the extra "gemma") steps
past its sliding window, and the page's KV cache groups show five sliding-window groups that freed their
blocks out of the window (∅ entries, at most a window's blocks in use) beside a full-attention group that
kept them all. Helpers from tests/test_app_browser.py."""

from __future__ import annotations

import os
import re
import time

import pytest

from test_app_browser import CHROMIUM, no_exception_box, open_app, start_server, step_button, step_title, free_port

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
            groups = page.locator('[data-testid="kv-group"]')
            groups.nth(5).wait_for(timeout=60_000)
            no_exception_box(page)
            heads = [groups.nth(i).locator("b").inner_text() for i in range(groups.count())]
            in_use = [int(groups.nth(i).get_attribute("data-in-use")) for i in range(groups.count())]
            nulls = [groups.nth(i).locator('[data-testid="kv-group-cell"]', has_text="∅").count() for i in range(groups.count())]
            cells = [groups.nth(i).locator('[data-testid="kv-group-cell"]').count() for i in range(groups.count())]
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
            browser.close()
    finally:
        server.kill()
        server.wait(timeout=30)


def _luminance(css_rgb: str) -> float:
    """WCAG relative luminance (0 black .. 1 white) of a CSS ``rgb(r, g, b)`` colour."""
    channels = [int(x) / 255 for x in re.findall(r"\d+", css_rgb)[:3]]
    linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]
