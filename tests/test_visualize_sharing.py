"""What the sharing views say: refcount badges, holders and copy-on-write in the pool map, and the
beam tree with its pruned branches — read from the chart data, in both languages."""

from __future__ import annotations

import re

import pytest

from engine import BeamSearchParams, EngineConfig, LLMEngine, SamplingParams
from engine.report import COPY_ON_WRITE, FREE
from visualize.beam_tree import beam_tree_rows, beam_tree_spec
from visualize.i18n import t
from visualize.pool import event_log_rows, pool_frame, pool_map_spec

PROMPT = [5, 6, 7, 8, 9, 10, 11]  # 7 tokens: one full block of 4 and a partly filled one


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    return LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=48))


def run(engine, params):
    request_id = engine.add_request(PROMPT, params)
    reports = []
    while engine.has_unfinished_requests():
        reports.append(engine.step())
    return request_id, reports


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_pool_map_shows_refcounts_holders_and_the_copy_on_write(engine, lang):
    _, reports = run(engine, SamplingParams(n=3, max_tokens=3, temperature=1.0, seed=1))
    forked, copied = reports[0], reports[1]
    df = pool_frame(forked, 4, lang)
    shared = df[df["badge"] != ""]
    assert list(shared["badge"]) == ["×3", "×3"], "both prompt blocks are held by 3 samples"
    holders = shared.iloc[0]["holders_text"]
    assert holders.count(t("seq_of_request", lang, seq=0, request=0)[:2]) == 3
    cow = [e for e in copied.events if e.kind == COPY_ON_WRITE]
    df = pool_frame(copied, 4, lang)
    src, dst = cow[0].block_id, cow[0].dst_block_id
    assert df.loc[df["block"] == src, "cow"].item() == "src" and df.loc[df["block"] == dst, "cow"].item() == "dst"
    assert df.loc[df["block"] == dst, "cow_text"].item() == t("cow_dst", lang, src=src)
    dsts = t("sep_list", lang).join(str(e.dst_block_id) for e in cow)
    assert df.loc[df["block"] == src, "cow_text"].item() == t("cow_src", lang, dst=dsts), "2 writers copied it, the 3rd wrote in place"
    writes = [r["detail"] for r in event_log_rows(copied, lang) if r["kind"] == "write"]
    assert writes and not any(re.search(r"(\d+)–\1\b", d) for d in writes), writes  # not "positions 7–7"
    same = t("ev_write_same_position_detail", lang, count=3, position=7, blocks="BLOCKS").split("BLOCKS")[0]
    assert any(d.startswith(same) for d in writes), "3 samples write position 7, one token each"
    assert "" not in set(df["touched_text"]) | set(df["cow_text"]), "no blank tooltip field"
    assert set(df.loc[df["cow"] == "", "cow_text"]) == {"–"} and t("no", lang) in set(df["touched_text"])
    spec = pool_map_spec(copied, 4, lang)
    dashes = {layer["transform"][0]["filter"]: layer["mark"]["strokeDash"] for layer in spec["layer"]
              if layer.get("transform") and "datum.cow ==" in layer["transform"][0].get("filter", "")}
    assert dashes == {"datum.cow == 'src'": [4, 2], "datum.cow == 'dst'": [1, 0]}, "source dashed, copy solid"
    titles = [f["title"] for f in spec["layer"][0]["encoding"]["tooltip"]]
    assert t("ref_count", lang) in titles and t("holders", lang) in titles and t("copy_on_write", lang) in titles


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_sharing_and_copy_on_write_are_drawn_apart_in_the_map_and_the_pngs(engine, lang):
    """A shared block (refcount > 1) is dotted slate with its ×n in every view; only this step's
    copy-on-write is pink (source dashed, copy solid): the pool map, and both PNG exports."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from visualize.colors import COW_COLOR, SHARED_COLOR
    from visualize.pool import block_tables_figure, pool_map_figure

    _, reports = run(engine, SamplingParams(n=3, max_tokens=3, temperature=1.0, seed=1))
    forked, copied = reports[0], reports[1]
    spec = pool_map_spec(forked, 4, lang)
    strokes = {(layer["mark"].get("stroke"), str(layer["mark"].get("strokeDash"))) for layer in spec["layer"]
               if layer.get("transform") and "ref_count > 1" in layer["transform"][0].get("filter", "")}
    assert strokes == {(SHARED_COLOR, "[2, 2]")}
    for report, cow in ((forked, False), (copied, True)):
        for fig in (pool_map_figure(report, 4, lang), block_tables_figure(report, 4, lang)):
            ax = fig.axes[0]
            borders = {(to_hex(p.get_edgecolor()), p.get_linestyle()) for p in ax.patches}
            texts = [x.get_text() for x in ax.texts]
            assert (SHARED_COLOR, ":") in borders and "×3" in texts, "shared: dotted slate and its refcount"
            assert ((COW_COLOR, "--") in borders and (COW_COLOR, "-") in borders) == cow, "pink only for a copy this step"
            legend = [x.get_text() for x in ax.get_legend().get_texts()]
            assert t("legend_shared", lang) in legend and (t("legend_cow_dst", lang) in legend) == cow
            plt.close(fig)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_beam_tree_shows_forks_and_pruned_branches_returning_blocks(engine, lang):
    request_id, reports = run(engine, BeamSearchParams(beam_width=3, max_tokens=8))
    nodes, edges = beam_tree_rows(reports, request_id)
    live = [n for n in nodes if not n["pruned"]]
    pruned = [n for n in nodes if n["pruned"]]
    assert max(sum(1 for n in live if n["step"] == s) for s in {n["step"] for n in live}) == 3
    assert any(e["forked"] for e in edges), "the prefill forks the prompt into 3 beams"
    pruned_frees = {(r.step, e.seq_id, e.block_id) for r in reports for e in r.events
                    if e.kind == FREE and e.request_id == request_id and r.finished.get(request_id) is None}
    assert {(n["pruned_step"], n["seq_id"], b) for n in pruned for b in n["freed"]} == pruned_frees
    assert all(n["pruned_step"] == n["step"] + 1 for n in pruned), "drawn at its last live step"
    spec = beam_tree_spec(reports, request_id, lang)
    assert spec["title"] == t("beam_tree_title", lang)
    states = {n["state"] for n in spec["layer"][1]["data"]["values"]}
    assert t("beam_live", lang) in states
    assert pruned, "some beam was pruned (beam width 3, 8 tokens)"
    assert {t("beam_pruned", lang, step=n["pruned_step"]) for n in pruned} <= states


def test_beam_tree_of_a_real_beam_search_draws_pruned_beams_where_they_died(default_model_dir):
    """The default model's beam search of the app's preset: a grey (pruned) node is a beam's last
    node and no line leaves it; every beam that stops while the search goes on ends grey; no two
    nodes share a place (a pruned beam drawn over a live one told the wrong survival story)."""
    engine = LLMEngine(EngineConfig(model=str(default_model_dir), num_gpu_blocks=64))
    request_id = engine.add_request([{"role": "user", "content": "Tell me a short story about a cat."}],
                                    BeamSearchParams(beam_width=4, max_tokens=12))
    reports = []
    while engine.has_unfinished_requests():
        reports.append(engine.step())
    nodes, edges = beam_tree_rows(reports, request_id)
    places = [(n["step"], n["rank"]) for n in nodes]
    assert len(places) == len(set(places)), "one node per place"
    leaving = {(e["step"] - 1, e["from_rank"]) for e in edges}
    grey = [n for n in nodes if n["pruned"]]
    assert grey, "beams were pruned in this run"
    assert not [(n["step"], n["rank"]) for n in grey if (n["step"], n["rank"]) in leaving], "a line leaves a pruned beam"
    last_step = max(n["step"] for n in nodes)
    last = {}
    for n in nodes:
        last[n["seq_id"]] = n
    ended = [n for n in last.values() if n["step"] < last_step]
    assert ended and all(n["pruned"] for n in ended), [n for n in ended if not n["pruned"]]
    assert all(last[n["seq_id"]] is n for n in grey), "only a beam's last node is grey"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_prefix_caching_shows_cached_free_blocks_and_the_free_queue(tiny_llama_dir, lang):
    """After a request finishes, its full blocks stay cached on the free queue: the pool map colours
    them apart from plain free blocks, the strip lists the queue head first, and a saved run keeps both."""
    from engine.runfile import Run, Workload, WorkloadRequest, load_run, run_json
    from visualize.colors import CACHED_COLOR, FREE_COLOR
    from visualize.pool import free_queue_cells

    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=24))
    run(engine, SamplingParams(max_tokens=2))  # 7 + 2 tokens: blocks 0 and 1 full, hashed, then freed
    _, reports = run(engine, SamplingParams(max_tokens=2))  # the same prompt hits block 0
    last = reports[-1]
    assert len(last.cached_free) >= 1 and set(last.cached_free) <= set(last.free_queue)
    df = pool_frame(last, 4, lang)
    for b in range(24):
        color = df.loc[df["block"] == b, "color"].item()
        if b in last.cached_free:
            assert color == CACHED_COLOR
            assert last.cached_free[b][:8] in df.loc[df["block"] == b, "owner_text"].item()
        elif b in last.free_queue:
            assert color == FREE_COLOR
    cells = free_queue_cells(last, lang)
    assert [c["block"] for c in cells] == last.free_queue[:64], "head (evicted next) first"
    assert all((c["color"] == CACHED_COLOR) == (c["block"] in last.cached_free) for c in cells)
    saved = Run(Workload(settings={}, requests=[WorkloadRequest("tokens 5..11", 2)]), dict(model_name="tiny", block_size=4, num_blocks=24, bytes_per_slot=1),
                {}, reports)
    back = load_run(run_json(saved).encode(), "run.json").steps[-1]
    assert back.free_queue == last.free_queue and back.cached_free == last.cached_free
    assert back.prefix_cache == last.prefix_cache


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_pool_map_marks_hits_and_evictions_and_names_the_hash_chain(tiny_llama_dir, lang):
    """vLLM's order on a pool of 8 blocks of 4: a prompt that begins with a finished request's 8 tokens
    hits its 2 blocks (dots, each with its hash and parent chain); a long new prompt then needs more
    plain blocks than are free and evicts cached ones (crosses). The legend names both marks."""
    from engine.report import CACHE_HIT, EVICT
    from visualize.prefix import cached_and_computed, parent_chain_text, short_hash

    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=8))
    first = list(range(5, 17))
    engine.add_request(first, SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        engine.step()
    rid = engine.add_request(first[:8] + [40, 41, 42, 43, 44], SamplingParams(max_tokens=1))
    report = engine.step()
    cache = engine.kv.prefix_cache.entries()
    hits = [e for e in report.events if e.kind == CACHE_HIT]
    assert [e.logical_index for e in hits] == [0, 1]
    df = pool_frame(report, 4, lang, cache=cache)
    marked = df[df["mark_text"] != ""]
    assert sorted(marked["block"]) == sorted(e.block_id for e in hits)
    assert set(marked["mark_text"]) == {t("mark_hit", lang)}
    row = df.set_index("block")
    a, b = hits
    assert row.loc[a.block_id, "hash_text"] == short_hash(a.block_hash) == a.block_hash[:8]
    assert row.loc[a.block_id, "parent_text"] == t("hash_chain_start", lang)
    assert row.loc[b.block_id, "parent_text"] == f"{t('hash_parent', lang, block=a.block_id, hash=a.block_hash[:8])} ← {t('hash_chain_start', lang)}"
    out = engine.get_output(rid)
    assert cached_and_computed([report], 4)[rid] == (out.num_cached_tokens, 5) == (8, 5), "8 cached, 5 computed"

    engine.add_request(list(range(100, 124)), SamplingParams(max_tokens=1))  # 6 blocks; 4 plain ones are free
    report = engine.step()
    evicted = {e.block_id for e in report.events if e.kind == EVICT}
    assert len(evicted) >= 2
    df = pool_frame(report, 4, lang, cache=engine.kv.prefix_cache.entries())
    assert set(df.loc[df["mark_text"] == t("mark_evict", lang), "block"]) == evicted
    spec = pool_map_spec(report, 4, lang, cache=engine.kv.prefix_cache.entries())
    point = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "point")
    assert point["encoding"]["color"]["scale"]["domain"] == [t("mark_hit", lang), t("mark_evict", lang)]
    titles = [f["title"] for f in spec["layer"][0]["encoding"]["tooltip"]]
    assert t("block_hash", lang) in titles and t("parent_chain", lang) in titles
    # a parent whose block was evicted since is named by its hash alone
    assert parent_chain_text(3, {3: ("ab" * 32, "cd" * 32)}, lang) == t("hash_parent_evicted", lang, hash="cdcdcdcd")
