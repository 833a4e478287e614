"""The prefill/decode handover page in a real browser, the default model, one session, both languages:
a prompt's blocks lent in the prefill instance's pool, then read into the decode instance's pool, with
the handover's row (blocks moved, bytes, ms, the lease released), in English and in 中文; then the push
order's steps, its reservation on the decode instance and its write. Helpers
from tests/test_app_browser.py; screenshots go to artifacts/screenshots/."""

from __future__ import annotations

import os
import re
import time

import pytest

from test_app_browser import CHROMIUM, SHOTS, free_port, no_exception_box, start_server, step_title

pytestmark = pytest.mark.slow


def fresh(page):
    """Elements of the current run only (a rerun keeps the previous run's, marked data-stale, a moment)."""
    return page.locator('xpath=//*[not(ancestor-or-self::*[@data-stale="true"])]')


def pool(page, role: str) -> dict[int, tuple[str, str]]:
    """The pool of ``role`` as drawn: block -> (request number or "", state)."""
    cells = page.locator(f'[data-testid="ho-pool"][data-role="{role}"] [data-testid="ho-block"]').and_(fresh(page))
    return {int(c["block"]): (c["request"], c["state"]) for c in cells.evaluate_all(
        "cells => cells.map(c => ({block: c.dataset.block, request: c.dataset.request, state: c.dataset.state}))")}


def transfer_row(page) -> dict[str, str]:
    """The handover table's only row, header -> cell text."""
    table = page.locator('[data-testid="ho-transfers"]').and_(fresh(page))
    heads = table.locator("th").all_inner_texts()
    cells = table.locator('[data-testid="ho-row"] td').all_inner_texts()
    assert len(cells) == len(heads), (heads, cells)
    return dict(zip(heads, cells))


def order_steps(page) -> list[str]:
    """The chosen order's steps, as listed."""
    return page.locator('[data-testid="ho-order-step"]').and_(fresh(page)).all_inner_texts()


def click(page, name: str) -> None:
    page.get_by_role("button", name=name, exact=True).and_(fresh(page)).click()


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")
def test_a_prompts_blocks_move_from_the_prefill_pool_to_the_decode_pool_in_both_languages(default_model_dir):
    sync_api = pytest.importorskip("playwright.sync_api")
    SHOTS.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(port, {k: v for k, v in os.environ.items() if k != "PAGEDATTENTION_LAB_MODEL"})
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM)
            page = browser.new_page(viewport={"width": 1440, "height": 1400})
            deadline = time.time() + 120
            while True:
                try:
                    page.goto(f"http://127.0.0.1:{port}/handover", timeout=5000)
                    break
                except sync_api.Error:
                    assert time.time() < deadline and server.poll() is None, "the app did not start"
                    time.sleep(0.3)
            page.get_by_role("button", name="Send", exact=True).wait_for(timeout=300_000)  # both engines built
            click(page, "Send")
            page.get_by_text("Request 0 sent to the prefill instance", exact=False).wait_for(timeout=30_000)
            click(page, "Step")
            step_title(page, "Step 0")
            prefill, decode = pool(page, "prefill"), pool(page, "decode")
            lent = sorted(b for b, (rid, state) in prefill.items() if state == "lent")
            assert lent and all(prefill[b][0] == "0" for b in lent), prefill
            assert all(state == "free" for _, state in decode.values()), "nothing on the decode instance yet"
            assert transfer_row(page)["Lease state"] == "lent"
            page.screenshot(path=str(SHOTS / "handover_en_lent.png"), full_page=True)

            click(page, "Step")
            step_title(page, "Step 1")
            prefill, decode = pool(page, "prefill"), pool(page, "decode")
            assert all(state == "free" for _, state in prefill.values()), "read and released: the prefill blocks are free"
            loading = sorted(b for b, (rid, state) in decode.items() if state == "loading")
            row = transfer_row(page)
            moves = [tuple(map(int, m.split("→"))) for m in row["Blocks moved (prefill → decode)"].split()]
            assert [p for p, _ in moves] == lent and [d for _, d in moves] == loading, (moves, lent, loading)
            assert row["Lease state"] == "released" and row["Decode instance"] == "loading" and row["Blocks"] == str(len(lent))
            assert re.fullmatch(r"\d+\.\d+ (KiB|MiB)", row["Bytes"]) and float(row["Read (ms)"]) >= float(row["Copy (ms)"]) > 0, row
            assert row["Lease"].endswith("…") and len(row["Lease"]) == 7, "the lease's id shortened, never whole"
            no_exception_box(page)
            page.screenshot(path=str(SHOTS / "handover_en.png"), full_page=True)

            page.locator('[data-testid="stSidebar"]').get_by_text("中文").click()
            step_title(page, "第 1 步")
            row_zh = transfer_row(page)
            assert row_zh["租约状态"] == "已释放" and row_zh["解码实例"] == "加载中" and row_zh["块数"] == str(len(lent))
            assert row_zh["移动的块（预填充 → 解码）"] == row["Blocks moved (prefill → decode)"] and row_zh["字节数"] == row["Bytes"]
            click(page, "单步")
            step_title(page, "第 2 步")
            decode = pool(page, "decode")
            assert sorted(b for b, (_, state) in decode.items() if state == "loaded") == loading, "the bytes landed in its blocks"
            assert transfer_row(page)["解码实例"] == "已加载"
            assert "请求 0：它的 KV 已写入解码实例的块" in page.locator('[data-testid="ho-story"]').and_(fresh(page)).inner_text()
            assert page.get_by_text("预填充实例（kv_producer）").count() == 1 and page.get_by_text("Prefill instance").count() == 0
            no_exception_box(page)
            page.screenshot(path=str(SHOTS / "handover_zh.png"), full_page=True)

            # The push order (SGLang's): the steps in the order they happen, then the decode instance reserving first.
            page.get_by_text("推送：预填充实例写入（SGLang）", exact=True).click()
            step_title(page, "第一步之前", timeout_s=300)  # both engines rebuilt for the push order
            steps = order_steps(page)
            assert len(steps) == 4 and "同时发送到两个实例" in steps[0] and "解码实例为提示词预留块" in steps[1] \
                and "预填充实例计算提示词，把它的 KV 写进预留的解码块" in steps[2], steps
            page.get_by_role("button", name="发送", exact=True).wait_for(timeout=300_000)
            click(page, "发送")
            page.get_by_text("请求 0 已同时发送到两个实例", exact=False).wait_for(timeout=30_000)
            click(page, "单步")
            step_title(page, "第 0 步")
            assert transfer_row(page)["状态（KVPoll）"] == "WaitingForInput"
            reserved = sorted(b for b, (_, state) in pool(page, "decode").items() if state == "reserved")
            assert reserved and all(state == "free" for _, state in pool(page, "prefill").values()), \
                "the decode instance holds the reservation; the prefill instance holds nothing while it waits"
            assert re.search(r"解码实例为它的 KV 预留了 \d+ 个块", page.locator('[data-testid="ho-story"]').and_(fresh(page)).inner_text())
            page.locator('[data-testid="stSidebar"]').get_by_text("English").click()
            step_title(page, "Step 0")
            assert [s.split(" ")[:3] for s in order_steps(page)] == [["The", "prompt", "goes"], ["The", "decode", "instance"],
                                                                       ["The", "prefill", "instance"], ["The", "decode", "instance"]]
            click(page, "Step")
            step_title(page, "Step 1")
            row = transfer_row(page)
            moves = [tuple(map(int, m.split("→"))) for m in row["Blocks moved (prefill → decode)"].split()]
            assert row["State (KVPoll)"] == "Success" and [d for _, d in moves] == reserved, (row, reserved)
            assert "wrote" in page.locator('[data-testid="ho-story"]').and_(fresh(page)).first.inner_text()
            no_exception_box(page)
            page.screenshot(path=str(SHOTS / "handover_push_en.png"), full_page=True)
            browser.close()
    finally:
        server.kill()
        out, _ = server.communicate(timeout=30)
        print(out[-3000:] if out else "")
