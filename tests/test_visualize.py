"""visualize/: data and figures from real StepReports of a tiny-model engine run, drawn headless."""

from __future__ import annotations

import itertools
import json
import math
import string

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.accounting import CATEGORIES
from engine.report import ALLOCATE, WRITE
from visualize import i18n
from visualize.kernel import program_grid, program_grid_figure
from visualize.memory import memory_chart, memory_figure, memory_frame, series_figure, simulation_memory_frame
from visualize.paper import plot_memory_breakdown
from visualize.pool import (block_table_rows, block_tables_figure, event_log_rows, pool_blocks, pool_map_chart,
                            pool_map_figure, pool_map_spec, touched_blocks)

PROMPTS = ["Hello there, how are you today?", "Tell me a story about a dragon.", "What is two plus two?"]


def run(model_dir, allocator="paged", steps=6, **config):
    llm = LLMEngine(EngineConfig(model=str(model_dir), num_gpu_blocks=12, block_size=4, allocator=allocator, **config))
    for p in PROMPTS:
        llm.add_request(p, SamplingParams(max_tokens=5, ignore_eos=True))
    return llm, [llm.step() for _ in range(steps)]


@pytest.fixture(scope="module")
def paged(tiny_llama_dir):
    return run(tiny_llama_dir)


@pytest.fixture(scope="module")
def contiguous(tiny_llama_dir):
    return run(tiny_llama_dir, allocator="contiguous", reservation="pow2")


def is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pool_blocks_follow_the_block_tables(paged):
    llm, reports = paged
    first = reports[0]
    blocks = pool_blocks(first, 4)
    assert len(blocks) == llm.num_blocks
    owned = {(s.request_id, i): b for s in first.block_tables for i, b in enumerate(s.block_table)}
    for (rid, logical), b in owned.items():
        assert blocks[b]["owner"] == rid and blocks[b]["logical_index"] == logical
    assert sum(b["filled"] for b in blocks) == first.memory.token_states
    assert sum(b["owner"] is None for b in blocks) == llm.num_blocks - len(owned)
    allocated = {e.block_id for e in first.events if e.kind == ALLOCATE}
    assert allocated and allocated <= touched_blocks(first)
    assert all(blocks[b]["touched"] for b in allocated)
    assert len(block_table_rows(first)) == len(owned)


def test_contiguous_blocks_can_be_shared(contiguous):
    llm, reports = contiguous
    report = reports[0]
    assert all(s.slot_range is not None for s in report.block_tables)
    blocks = pool_blocks(report, 4)
    held = sum(b["filled"] for b in blocks)
    # A block shared by two ranges shows its larger owner's tokens; every token is still counted once per owner.
    assert held <= report.memory.token_states
    for snap in report.block_tables:
        for b in snap.block_table:
            assert snap.request_id in blocks[b]["owners"]


def test_event_log_summarises_writes(paged):
    _, reports = paged
    prefill = reports[0]
    rows = event_log_rows(prefill)
    writes = [r for r in rows if r["kind"] == WRITE]
    assert len(writes) == len(prefill.scheduled)  # one row per request, not one per token
    for r, s in zip(writes, prefill.scheduled):
        assert r["request_id"] == s.request_id and f"{s.num_tokens} token(s), positions 0–{s.num_tokens - 1}" in r["detail"]
    assert sum(r["kind"] == ALLOCATE for r in rows) == sum(e.kind == ALLOCATE for e in prefill.events)
    zh = event_log_rows(prefill, "zh")
    assert {r["event"] for r in zh} >= {"分配", "写入"}
    decode = next(r for r in reports[1:] if r.phase == "decode")
    write = next(e for e in decode.events if e.kind == WRITE)
    first_row = next(r for r in event_log_rows(decode) if r["kind"] == WRITE and r["request_id"] == write.request_id)
    assert first_row["detail"] == f"position {write.position} → slot {write.slot} (block {write.block_id})"


def test_memory_frame_sums_to_capacity(paged):
    llm, reports = paged
    frame = memory_frame(reports)
    assert list(frame["step"]) == [r.step for r in reports]
    assert (frame[list(CATEGORIES)].sum(axis=1) == reports[0].memory.capacity).all()
    mib = memory_frame(reports, "MiB")
    assert mib["token_states"].iloc[-1] == pytest.approx(frame["token_states"].iloc[-1] * llm.bytes_per_slot / 2**20)
    with pytest.raises(ValueError):
        memory_frame(reports, "bytes")
    memory_chart(frame).to_dict()  # a valid Vega-Lite spec


def test_figures_save_as_png(paged, contiguous, tmp_path):
    llm, reports = paged
    mid = reports[2]  # requests still hold blocks (all have finished by the last step)
    assert mid.block_tables
    figures = {
        "pool": pool_map_figure(mid, 4),
        "pool_zh": pool_map_figure(mid, 4, "zh"),
        "contiguous_pool": pool_map_figure(contiguous[1][2], 4),
        "tables": block_tables_figure(mid, 4),
        "memory": memory_figure(memory_frame(reports), lang="zh"),
        "series": series_figure({"paged": ([0, 1, 2], [3, 3, 2])}, "requests"),
    }
    for name, fig in figures.items():
        path = tmp_path / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        assert is_png(path) and path.stat().st_size > 2000, name


def drawn_texts(fig) -> list[tuple[str, object]]:
    """Each text matplotlib's Agg renderer draws in ``fig`` (tick labels outside the view are made but
    not drawn), with its box in pixels, as the PNG that st.pyplot or a download makes would show it."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    drawn = []
    draw_text = renderer.draw_text

    def record(gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if mtext is not None and s.strip():
            drawn.append(mtext)
        return draw_text(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

    renderer.draw_text = record
    fig.draw(renderer)
    return [(text.get_text(), text.get_window_extent(renderer)) for text in dict.fromkeys(drawn)]


def text_problems(fig) -> list[str]:
    """Texts that stick out of the figure (cut in a PNG saved without bbox_inches="tight": slides,
    reproduce-paper) or lie on top of each other."""
    box = fig.bbox
    texts = drawn_texts(fig)
    assert texts, "no text drawn"
    problems = []
    for text, e in texts:
        over = max(box.x0 - e.x0, e.x1 - box.x1, box.y0 - e.y0, e.y1 - box.y1)
        if over > 0.5:
            problems.append(f"{text!r} sticks out of the figure by {over:.0f} px")
    for (a, ea), (b, eb) in itertools.combinations(texts, 2):
        if min(ea.x1, eb.x1) - max(ea.x0, eb.x0) > 2 and min(ea.y1, eb.y1) - max(ea.y0, eb.y0) > 2:
            problems.append(f"{a!r} overlaps {b!r}")
    return problems


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_figure_text_is_inside_the_figure(paged, contiguous, lang):
    """Every figure the app shows (Figure 2 bars, the program grid) or offers as a PNG, drawn from real
    runs in both languages: no text outside the figure, none on another. The single-panel Figure 2's
    legend was 20 px wider than the figure; the pool map's and block tables' titles stood above it."""
    from app_pages.compare import _paper_row, system_label

    llm, reports = paged
    mid = reports[2]
    snaps = mid.block_tables
    programs = {splits: program_grid([s.request_id for s in snaps], [sum(s.filled) for s in snaps], [s.block_table for s in snaps],
                                     4, num_heads=4, num_kv_heads=2, num_splits=splits) for splits in (1, 4)}
    runs = {"paged": reports, "contiguous (pow2)": contiguous[1]}
    rows = [dict(_paper_row(i18n.t("fig2_workload_engine", lang), key, memory_frame(r)), system=system_label(key, lang))
            for key, r in runs.items()]
    series = {system_label(key, lang): ([r.step for r in rs], [len(r.scheduled) for r in rs]) for key, rs in runs.items()}
    figures = {
        "figure 2": plot_memory_breakdown(rows, lang=lang),
        "program grid": program_grid_figure(programs[1], lang),
        "program grid, 4 splits": program_grid_figure(programs[4], lang),
        "pool map": pool_map_figure(mid, 4, lang),
        "contiguous pool map": pool_map_figure(contiguous[1][2], 4, lang),
        "block tables": block_tables_figure(mid, 4, lang),
        "memory": memory_figure(memory_frame(reports), lang=lang, title=system_label("paged", lang)),
        "concurrency": series_figure(series, i18n.t("concurrency", lang), lang),
    }
    problems = {name: text_problems(fig) for name, fig in figures.items()}
    for fig in figures.values():
        plt.close(fig)
    assert {name: p for name, p in problems.items() if p} == {}


def test_pool_map_spec_is_plain_json(paged):
    llm, reports = paged
    spec = pool_map_spec(reports[2], 4, "zh")
    json.dumps(spec)
    assert len(spec["data"]["values"]) == llm.num_blocks
    assert spec["layer"][0]["encoding"]["tooltip"][1]["title"] == "占用者"
    pool_map_chart(reports[-1], 4).to_dict()  # the Altair twin validates against the Vega-Lite schema


def test_program_grid_matches_the_block_tables(paged, tmp_path):
    llm, reports = paged
    report = reports[2]
    tables = [s.block_table for s in report.block_tables]
    lens = [sum(s.filled) for s in report.block_tables]
    ids = [s.request_id for s in report.block_tables]
    one = program_grid(ids, lens, tables, 4, num_heads=4, num_kv_heads=2)
    assert len(one) == len(ids) * 2
    for p in one:
        seq = p["sequence"]
        assert p["blocks"] == tables[seq][: math.ceil(lens[seq] / 4)]
        assert p["query_heads"] == ([0, 1] if p["kv_head"] == 0 else [2, 3])
    split = program_grid(ids, lens, tables, 4, num_heads=4, num_kv_heads=2, num_splits=2)
    assert sorted(p["program"] for p in split) == list(range(len(ids) * 2 * 2))
    for seq in range(len(ids)):  # the partitions of one (sequence, head) tile its context, in order
        parts = sorted((p for p in split if p["sequence"] == seq and p["kv_head"] == 0), key=lambda p: p["partition"])
        assert parts[0]["start"] == 0 and parts[-1]["end"] == lens[seq]
        assert all(a["end"] == b["start"] for a, b in zip(parts, parts[1:]))
        for p in parts:  # a block cut by a partition boundary is read (in part) by both programs
            assert p["blocks"] == tables[seq][p["start"] // 4 : math.ceil(p["end"] / 4)]
    fig = program_grid_figure(split, "zh")
    fig.savefig(tmp_path / "grid.png")
    assert is_png(tmp_path / "grid.png")


def test_simulation_memory_frame():
    from engine.sim.simulator import simulate

    res = simulate(workload="alpaca", num_requests=50, kv_slots=4096, allocator="contiguous", reservation="pow2")
    frame = simulation_memory_frame(res)
    assert len(frame) == len(res.series_step)
    assert frame[list(CATEGORIES)].sum(axis=1).round().eq(4096).all()


def test_catalogue_is_complete():
    for key, (en, zh) in i18n.CATALOGUE.items():
        assert en.strip() and zh.strip(), key
        fields = lambda s: {f for _, f, _, _ in string.Formatter().parse(s) if f}
        assert fields(en) == fields(zh), key  # the same placeholders in both languages
    assert i18n.t("step", "zh") == "单步"
    assert i18n.t("step_summary", "en", step=3) == "Step 3"
    with pytest.raises(KeyError):
        i18n.t("no such key")
    with pytest.raises(ValueError):
        i18n.t("step", "fr")


def test_memory_chart_shows_a_single_step(paged):
    _, reports = paged
    chart = memory_chart(memory_frame(reports[:1])).to_dict()
    values = chart["datasets"][next(iter(chart["datasets"]))]
    xs = sorted({row["x"] for row in values})
    assert xs == [reports[0].step - 0.5, reports[0].step + 0.5], "one step must span a visible width, centred on its tick"
    assert {row["step"] for row in values} == {reports[0].step}, "the tooltip names the step"


def test_memory_chart_axis_ends_at_the_last_step(paged):
    _, reports = paged
    chart = memory_chart(memory_frame(reports)).to_dict()
    scale = chart["encoding"]["x"]["scale"]
    assert scale["domain"] == [reports[0].step - 0.5, reports[-1].step + 0.5] and scale["nice"] is False


def _luminance(color: str) -> float:
    """WCAG 2 relative luminance of ``#rrggbb``."""
    def channel(c: int) -> float:
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def _contrast(a: str, b: str) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def _lab(color: str) -> tuple[float, float, float]:
    """CIELAB (D65) of ``#rrggbb``."""
    def channel(c: int) -> float:
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (channel(int(color[i : i + 2], 16)) for i in (1, 3, 5))
    x, y, z = ((0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b,
               (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883)
    f = lambda v: v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116  # noqa: E731
    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def test_every_request_colour_is_readable_on_white_and_unlike_the_others():
    """A request's text is drawn in its colour on white, a block number in dark grey on it (a projector
    washes pale colours out): WCAG's 3:1 for bold text and graphics against white, 2:1 against the
    numbers; and any two requests at least 15 CIELAB units apart."""
    import itertools
    import math

    from visualize.colors import FREE_COLOR, request_color

    colors = [request_color(i) for i in range(40)]  # a class of 35 requests and more
    for i, color in enumerate(colors):
        assert _contrast(color, "#ffffff") >= 3, f"request {i}: {color} on white"
        assert _contrast(color, "#222222") >= 2, f"request {i}: block numbers on {color}"
    distinct = sorted(set(colors))
    assert FREE_COLOR not in distinct
    for a, b in itertools.combinations(distinct, 2):
        assert math.dist(_lab(a), _lab(b)) >= 15, f"{a} and {b} look alike"


@pytest.mark.skipif(not any("CJK" in p for p in matplotlib.font_manager.findSystemFonts()),
                    reason="needs a CJK font (apt-get install fonts-noto-cjk)")
def test_chinese_labels_draw_with_a_cjk_font_installed_after_matplotlib_listed_the_fonts(monkeypatch):
    import warnings

    from visualize import style

    manager = matplotlib.font_manager.fontManager
    # matplotlib's font list as cached before the CJK font was installed
    monkeypatch.setattr(manager, "ttflist", [f for f in manager.ttflist if "CJK" not in f.name])
    monkeypatch.setitem(matplotlib.rcParams, "font.family", list(matplotlib.rcParams["font.family"]))
    style.use_cjk_font.cache_clear()
    try:
        assert style.use_cjk_font() in style.CJK_FONTS
        fig, ax = plt.subplots()
        ax.set_title("块表与显存")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # matplotlib warns "Glyph ... missing from font(s)" for each box it draws
            fig.canvas.draw()
        plt.close(fig)
    finally:
        style.use_cjk_font.cache_clear()
