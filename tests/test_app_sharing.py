"""The app's memory-sharing presets, driven headless (streamlit.testing) on the tiny random Llama:
what a student reads — the sharing counter, one block-table row per sample with refcounts, the
beam tree — in English and Chinese."""

from __future__ import annotations

import html as html_lib
import json
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from app_pages.state import MODEL_ENV
from visualize.colors import COW_COLOR, SHARED_COLOR
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
    legend = "".join(m.value for m in app.markdown if "pool-legend" in m.value)
    assert t("legend_shared", lang) in legend, "the badge and the dotted border explained"
    assert t("legend_cow_src", lang) not in legend, "no copy-on-write this step: no pink outline to explain"
    cells = re.findall(r'<span data-testid="block-table-cell" title="[^"]*; [^"]* (\d+)" style="[^"]*border:([^;]*);', html)
    shared = {border for ref, border in cells if int(ref) > 1}
    assert shared == {f"2px dotted {SHARED_COLOR}"}, "a shared block is dotted slate, not a copy's pink"
    assert COW_COLOR not in html
    step(app)  # the first decode: each sample writes into the shared last prompt block, copying it
    report = app.session_state["reports"][-1]
    assert any(e.kind == "copy_on_write" for e in report.events)
    html = block_table_html(app)
    legend = "".join(m.value for m in app.markdown if "pool-legend" in m.value)
    assert t("legend_cow_src", lang) in legend and t("legend_cow_dst", lang) in legend
    assert f"3px solid {COW_COLOR}" in html and f"3px dashed {COW_COLOR}" in html, "this step's copies and their source"
    step(app)
    request = _request_block(app, 0)
    labels = re.findall(r'<small style="color:#888">([^<]*)</small> <span[^>]*data-testid="sequence-text">', request)
    assert labels == [t("sample_label", lang, index=i) for i in range(4)], "one line per sample"
    texts = _sequence_texts(request)
    engine = app.session_state["engine"]
    assert texts == [o.text for o in engine.get_output(0).outputs], "each sample's text as the engine has it"


def _request_block(at: AppTest, request_id: int) -> str:
    """The request list's entry of ``request_id`` (its header, prompt and text lines)."""
    html = "".join(m.value for m in at.markdown if "request-prompt" in m.value)
    return re.split(r'<div style="border-left', html)[request_id + 1]


def _sequence_texts(html: str) -> list[str]:
    import html as html_lib

    return [html_lib.unescape(x) for x in re.findall(r'data-testid="sequence-text">([^<]*)<', html)]


def test_beam_search_preset_draws_the_beam_tree(app: AppTest):
    load(app, "preset_beam_search", "en")
    step(app, 6)
    specs = [json.loads(c.proto.spec) for c in app.get("vega_lite_chart")]
    trees = [s for s in specs if s.get("title") == t("beam_tree_title", "en")]
    assert len(trees) == 1, "the beam tree is drawn"
    nodes = trees[0]["layer"][1]["data"]["values"]
    assert {n["rank"] for n in nodes if not n["pruned"]} == {0, 1, 2, 3}, "four live beams a step"
    html = block_table_html(app)
    assert "×" in html
    rows = re.findall(r"<b style[^>]*>([^<]*)</b>", html)
    assert len(rows) == 4 and all(" · beam " in row and "sample" not in row for row in rows), rows
    request = _request_block(app, 0)
    engine = app.session_state["engine"]
    live = [b for b in engine.requests[0].seqs]  # the live beams, best first
    labels = re.findall(r'<small style="color:#888">([^<]*)</small>', request)
    assert [l.split(" · ")[0] for l in labels[:4]] == [f"beam {r}" for r in range(4)]
    assert all("log-prob" in l and "score" in l for l in labels[:4]), labels
    texts = _sequence_texts(request)
    decode = engine.tokenizer.decode
    # (a character whose bytes are split over tokens is held back from the stream until complete)
    assert texts[:4] == [decode(b.output_token_ids, skip_special_tokens=True).rstrip("\ufffd") for b in live], "best first"
    pruned = [l for l in labels[4:]]
    assert pruned and all(l == "pruned beam" for l in pruned), "pruned beams follow, greyed"
    assert "line-through" in request


def test_a_finished_beam_search_lists_its_final_beams(app: AppTest):
    """Once the search ends, the beam list shows the hypotheses the result was chosen from, whole:
    beam 0 is the result, token for token (the last step's token is not left off)."""
    load(app, "preset_beam_search", "en")
    app.number_input(key="n_steps").set_value(40).run()
    app.button(key="btn_run").click().run()
    assert not app.exception, [e.value for e in app.exception]
    request = _request_block(app, 0)
    assert t("beam_result", "en") in request
    final = app.session_state["engine"].get_output(0)
    texts, labels = _sequence_texts(request), re.findall(r'<small style="color:#888">([^<]*)</small>', request)
    result = re.search(r'data-testid="request-text">([^<]*)<', request).group(1)
    assert texts[:4] == [o.text for o in final.outputs] and texts[0] == html_lib.unescape(result), (texts[:4], result)
    assert [label.split(" · ")[0] for label in labels[:4]] == [f"beam {r}" for r in range(4)]
    assert all(f"log-prob {o.cumulative_logprob:.2f}" in label for o, label in zip(final.outputs, labels)), labels


def cached_split(at: AppTest, lang: str) -> list[tuple[int, int]]:
    """Each request's "N tok cached · M tok computed", in request order, as the request list says it."""
    pattern = re.escape(t("cached_computed", lang, cached="CACHED", computed="COMPUTED"))
    pattern = pattern.replace("CACHED", r"(\d+)").replace("COMPUTED", r"(\d+)")
    html = "".join(m.value for m in at.markdown if "request-text" in m.value)
    return [(int(c), int(n)) for c, n in re.findall(pattern, html)]


def chart_values(chart) -> list[dict]:
    """The rows a Vega-Lite chart draws (Streamlit sends a spec's top-level data apart, as Arrow)."""
    import pyarrow as pa

    return pa.ipc.open_stream(chart.proto.data.data).read_all().to_pandas().to_dict("records")


def run_steps(at: AppTest, n: int) -> None:
    at.number_input(key="n_steps").set_value(n).run()
    at.button(key="btn_run").click().run()
    assert not at.exception, [e.value for e in at.exception]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_shared_system_prompt_preset_says_what_each_request_found_cached(app: AppTest, lang: str):
    """Two at a time: the first two compute the system prompt in one step (neither can hit the other),
    the next two find its blocks cached; the request list says so, as the engine counts it."""
    if lang == "zh":
        app.radio(key="lang").set_value("zh").run()
    load(app, "preset_shared_system_prompt", lang)
    assert app.slider(key="max_batch").value == 2
    assert t("preset_shared_system_prompt_note", lang) in [c.value for c in app.main.caption]
    run_steps(app, 80)
    llm = app.session_state["engine"]
    assert not llm.has_unfinished_requests()
    split = cached_split(app, lang)
    assert len(split) == 4
    outputs = [llm.get_output(rid) for rid in sorted(llm.requests)]
    assert [c for c, _ in split] == [o.num_cached_tokens for o in outputs]
    assert split[0][0] == split[1][0] == 0 and split[2][0] >= 5 * 16 and split[3][0] >= 5 * 16
    for (cached, computed), out in zip(split, outputs):  # every prompt token once: cached or computed
        assert cached + computed == len(out.prompt_token_ids) + len(out.token_ids) - 1


def test_multi_turn_chat_preset_hits_the_history_and_the_pool_map_marks_it(app: AppTest):
    """The app sends each turn once the one before has finished, with the model's own answer in the
    history, as a chat client does: it hits the history's blocks, the answer's included (more each turn);
    in the step a turn is admitted, the pool map marks the hit blocks and names each one's hash and parent chain."""
    from visualize.prefix import short_hash

    load(app, "preset_multi_turn_chat", "en")
    assert app.slider(key="max_batch").value == 1
    run_steps(app, 100)
    llm = app.session_state["engine"]
    assert not llm.has_unfinished_requests() and len(llm.requests) == 3, "the app sent the three turns, one after another"
    cached = [c for c, _ in cached_split(app, "en")]
    assert cached[0] == 0 and 0 < cached[1] < cached[2], cached
    assert cached == [llm.get_output(rid).num_cached_tokens for rid in sorted(llm.requests)]
    first, second = llm.get_output(0), llm.get_output(1)
    answer = [i for i in first.token_ids if i not in llm.eos_token_ids]
    assert second.prompt_token_ids[: len(first.prompt_token_ids) + len(answer)] == first.prompt_token_ids + answer, \
        "turn 2 re-sends turn 1 and the model's own answer"
    assert cached[1] >= (len(first.prompt_token_ids) // 16 + 1) * 16, "blocks of the answer are hit too, not only the prompt's"
    reports = app.session_state["reports"]
    step, hits = next((r.step, [e for e in r.events if e.kind == "cache_hit"]) for r in reports
                      if any(e.kind == "cache_hit" and e.request_id == 2 for e in r.events))
    app.slider(key="replay_slider").set_value(step).run()
    chart = app.get("vega_lite_chart")[0]
    spec = json.loads(chart.proto.spec)
    cells = {c["block"]: c for c in chart_values(chart)}
    marked = sorted(b for b, c in cells.items() if c["mark_text"] == t("mark_hit", "en"))
    assert marked == sorted(e.block_id for e in hits)
    first, second = hits[0], hits[1]
    assert cells[first.block_id]["hash_text"] == short_hash(first.block_hash)
    assert cells[first.block_id]["parent_text"] == t("hash_chain_start", "en")
    assert cells[second.block_id]["parent_text"].startswith(t("hash_parent", "en", block=first.block_id, hash=short_hash(first.block_hash)))
    legend = next(layer for layer in spec["layer"] if layer["mark"].get("type") == "point")
    assert legend["encoding"]["color"]["scale"]["domain"] == [t("mark_hit", "en"), t("mark_evict", "en")]
    assert t("pool_cache_caption", "en") in [c.value for c in app.main.caption]
