"""The app's memory-sharing presets, driven headless (streamlit.testing) on the tiny random Llama:
what a student reads — the sharing counter, one block-table row per sample with refcounts, the
beam tree — in English and Chinese."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app_pages.state import MODEL_ENV
from visualize.i18n import t

APP = str(Path(__file__).resolve().parent.parent / "app.py")


@pytest.fixture
def app(tiny_llama_dir, monkeypatch) -> AppTest:
    monkeypatch.setenv(MODEL_ENV, str(tiny_llama_dir))
    at = AppTest.from_file(APP, default_timeout=400)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def load(at: AppTest, preset: str, lang: str) -> None:
    at.selectbox(key=f"preset__{lang}").set_value(preset).run()
    next(b for b in at.button if b.label == t("load_preset", lang)).click().run()
    assert not at.exception, [e.value for e in at.exception]


def step(at: AppTest, n: int = 1) -> None:
    for _ in range(n):
        at.button(key="btn_step").click().run()
        assert not at.exception, [e.value for e in at.exception]


def block_table_html(at: AppTest) -> str:
    return "".join(m.value for m in at.markdown if "<sup>" in m.value)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_parallel_sampling_preset_shows_shared_blocks_and_the_saving(app: AppTest, lang: str):
    if lang == "zh":
        app.radio(key="lang").set_value("zh").run()
    load(app, "preset_parallel_sampling", lang)
    step(app)  # the prompts' one prefill, then the forks
    saved = {m.label: m.value for m in app.metric}[t("memory_saved_by_sharing", lang)]
    assert float(saved.rstrip("%")) > 50, "4 samples on 2 prompts share every prompt block"
    html = block_table_html(app)
    rows = re.findall(r"<b style[^>]*>([^<]*)</b>", html)
    assert len(rows) == 8, "one block-table row per sample: 2 prompts x 4"
    for i, row in enumerate(rows[:4]):  # "Request 0 · sample i (seq s)", in the page's language
        sample = re.split(r"[(（]", t("sequence_index", lang, index=i, seq=0))[0].strip()
        assert row.startswith(f"{t('request', lang)} 0 · {sample}"), row
    assert "×4" in html, "a refcount of 4 on the shared prompt blocks"


def test_beam_search_preset_draws_the_beam_tree(app: AppTest):
    load(app, "preset_beam_search", "en")
    step(app, 6)
    specs = [json.loads(c.proto.spec) for c in app.get("vega_lite_chart")]
    trees = [s for s in specs if s.get("title") == t("beam_tree_title", "en")]
    assert len(trees) == 1, "the beam tree is drawn"
    nodes = trees[0]["layer"][1]["data"]["values"]
    assert {n["rank"] for n in nodes if not n["pruned"]} == {0, 1, 2, 3}, "four live beams a step"
    assert "×" in block_table_html(app)
