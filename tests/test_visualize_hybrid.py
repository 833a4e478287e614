"""What a class reads about a hybrid model's KV cache (vLLM v1's hybrid KV cache manager), on a tiny random
Gemma 3 (one sliding-window layer of window 8, one full-attention layer: two KV cache groups, blocks of 4):
why a block left a table, the pool map coloured by every group with the null block 0 marked, the block
tables of every group, the capacity in tokens of context, and what the sliding window saves. Model-free
where the numbers depend on lengths only (Gemma 3 270M's shape)."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.kv_cache_interface import SLIDING_WINDOW, gemma3_layer_types, get_kv_cache_config, layer_specs
from engine.report import FREE, FREED_OUT_OF_WINDOW
from visualize.colors import FREE_COLOR
from visualize.i18n import t
from visualize.kv_groups import (NULL_COLOR, blocks_held, group_color, pool_by_group_spec, window_saving_at, window_savings_frame,
                                 window_savings_spec)
from visualize.pool import block_tables_figure, event_log_rows, num_blocks_of, pool_blocks, pool_frame, pool_map_spec

BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def hybrid_reports(tiny_gemma_dir):
    """A 30-token prompt decoding 6 tokens past the 8-token window: every step's report."""
    engine = LLMEngine(EngineConfig(model=str(tiny_gemma_dir), block_size=BLOCK_SIZE, num_gpu_blocks=40, enable_prefix_caching=False))
    engine.add_request(list(range(10, 40)), SamplingParams(max_tokens=6, ignore_eos=True))
    return [engine.step() for _ in range(5)]


def test_a_block_freed_out_of_the_window_is_explained_by_the_window_and_names_its_group(hybrid_reports):
    step = next(r for r in hybrid_reports if any(e.detail == FREED_OUT_OF_WINDOW for e in r.events))
    frees = [e for e in step.events if e.kind == FREE]
    for lang, window, null, shared in (("en", "sliding window", "null block 0", "still held by others"),
                                       ("zh", "滑动窗口", "空块（null block）0", "其他序列仍持有")):
        rows = [row["detail"] for row in event_log_rows(step, lang) if row["kind"] == FREE]
        assert len(rows) == len(frees) > 0
        for row, e in zip(rows, frees):
            assert window in row and null in row and shared not in row, row
            assert t("kv_group_short", lang, group=e.kv_cache_group).split()[-1] in row  # the group's number
        assert f"(group {frees[0].kv_cache_group}, logical {frees[0].logical_index})" in event_log_rows(step, "en")[
            [r["kind"] for r in event_log_rows(step, "en")].index(FREE)]["detail"]


def test_the_pool_map_colours_every_groups_blocks_and_marks_the_null_block(hybrid_reports):
    report = hybrid_reports[3]  # decoding past the window: the sliding group has freed its first blocks
    sliding = next(g for g in report.kv_groups if g.attention_type == SLIDING_WINDOW)
    assert any(b == 0 for s in sliding.block_tables for b in s.block_table), "a null entry"
    blocks = pool_blocks(report, BLOCK_SIZE)
    assert len(blocks) == num_blocks_of(report, BLOCK_SIZE) == 40, "the null block 0 is in the map, and every usable block"
    held = {g.group_id: {b for s in g.block_tables for b in s.block_table if not (g is sliding and b == 0)} for g in report.kv_groups}
    frame = pool_frame(report, BLOCK_SIZE, "en")
    for group, ids in held.items():
        assert len(ids) == report.kv_groups[group].num_blocks_in_use
        assert all(blocks[b]["group"] == group for b in ids)
        assert set(frame.loc[frame.block.isin(ids), "color"]) == {group_color(report, group)}
    in_use = set().union(*held.values())
    assert set(frame.loc[~frame.block.isin(in_use | {0}), "color"]) == {FREE_COLOR}, "only free blocks are grey"
    null = frame.iloc[0]
    assert null.label == "∅" and null.color == NULL_COLOR and "null block" in null.owner_text
    assert "null block" in pool_frame(report, BLOCK_SIZE, "zh").iloc[0].owner_text  # 空块（null block）
    spec = pool_map_spec(report, BLOCK_SIZE, "en")
    assert spec["layer"][-1]["encoding"]["text"]["field"] == "label"
    # the PNG export draws every group's tables: one row per (group, request)
    fig = block_tables_figure(report, BLOCK_SIZE, "en")
    names = [x.get_text() for x in fig.axes[0].texts if x.get_text().startswith("Request")]
    assert names == [f"Request 0 · group {g.group_id}" for g in report.kv_groups]


def test_the_pool_by_group_chart_draws_a_cell_per_block_in_its_groups_colour(hybrid_reports):
    report = hybrid_reports[3]
    spec = pool_by_group_spec(report, num_blocks_of(report, BLOCK_SIZE), "en")
    cells = spec["data"]["values"]
    assert len(cells) == 40 and cells[0]["group"] == t("null_block", "en")
    assert spec["height"] >= 14 * 2 and spec["autosize"]["type"] == "fit-x", "the plot keeps its height beside the legend"
    drawn = {c["group"] for c in cells}
    assert all(label in drawn for label in spec["encoding"]["color"]["scale"]["domain"][:-1])


def test_the_savings_chart_is_in_mib_on_whole_steps_and_says_the_saving_grows_with_context(hybrid_reports):
    frame = window_savings_frame(hybrid_reports, BLOCK_SIZE)
    page_mib = hybrid_reports[0].memory.bytes_per_slot * BLOCK_SIZE / 2**20
    assert (frame.all_full_mib == frame.all_full * page_mib).all() and (frame.in_use < frame.all_full).any()
    spec = window_savings_spec(frame, "zh")
    assert spec["encoding"]["y"]["field"] == "mib" and spec["encoding"]["y"]["title"] == "KV 缓存（MiB）"
    assert spec["encoding"]["x"]["axis"]["format"] == "d" and spec["autosize"]["type"] == "fit-x"


def test_the_window_saving_at_a_context_length_is_what_the_engine_holds():
    """Gemma 3 270M's groups: the blocks a request holds at 1,300 tokens are the engine's (lesson 11's
    check), and the saving grows from 1.9x at 1,200 tokens to 5.6x at 32K."""
    from lessons.checks import hybrid_blocks_in_use

    report = _gemma_groups_report()
    assert sum(blocks_held(1_300, 16, g.sliding_window) for g in report.kv_groups) == hybrid_blocks_in_use(1_000, 1_300)
    assert f"{window_saving_at(report, 1_200, 16):.1f}" == "1.9" and f"{window_saving_at(report, 32_768, 16):.1f}" == "5.6"


def test_a_hybrid_pools_capacity_is_told_in_tokens_of_context():
    """Gemma 3 270M in float32 on 400 pages of 16: a page slot is one group's 3 layers (6 KiB); one token of
    context costs a slot in each of the 6 groups, 36 KiB; the 399 usable blocks hold 1,064 tokens of context."""
    from app_pages.sidebar import hybrid_capacity_text

    specs = layer_specs(18, 16, 1, 256, 4, sliding_window=512, layer_types=gemma3_layer_types(18))
    config = get_kv_cache_config(specs, num_blocks=400)
    slot_bytes = 3 * 2 * 256 * 4
    en = hybrid_capacity_text(config, 400, 16, slot_bytes, "en")
    assert "**36 KiB**" in en and "6 × 6.0 KiB" in en and "**1,064 tokens of context**" in en and "37.5 MiB" in en
    assert "3,744 tokens" in en, "399 blocks - 5 windows of 33 blocks = 234 full-attention blocks of 16"
    zh = hybrid_capacity_text(config, 400, 16, slot_bytes, "zh")
    assert "**36 KiB**" in zh and "**1,064 个 token 的上下文**" in zh


def test_the_null_block_is_defined_as_the_reserved_block_0_in_both_languages():
    en, zh = t("kv_groups_caption", "en"), t("kv_groups_caption", "zh")
    assert "∅: the null block, block 0 of the pool, reserved and never allocated" in en
    assert "∅：空块（null block），即块池中的块 0，它被预留、从不分配" in zh


def _gemma_groups_report():
    """A report carrying Gemma 3 270M's six KV cache groups (no blocks held)."""
    from engine.core.accounting import MemoryUsage
    from engine.report import KVCacheGroupReport, StepReport

    specs = layer_specs(18, 16, 1, 256, 4, sliding_window=512, layer_types=gemma3_layer_types(18))
    groups = [KVCacheGroupReport(i, g.kv_cache_spec.attention_type, g.kv_cache_spec.sliding_window, list(g.layer_names), [], 0)
              for i, g in enumerate(get_kv_cache_config(specs, num_blocks=400).kv_cache_groups)]
    return StepReport(step=0, phase="idle", scheduled=[], new_token_ids={}, new_text={}, finished={}, preempted=[], events=[],
                      block_tables=[], memory=MemoryUsage(16, 0, 0, 0, 0, 16), kv_groups=groups)
