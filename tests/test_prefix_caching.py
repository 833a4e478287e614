"""Automatic prefix caching (vLLM v1; paper §4.4 shared prefix): hashed full blocks, an LRU free queue.

- greedy outputs are the same with caching on and off, on the default model, also under preemption;
- the logits of the uncached suffix match the uncached run;
- vLLM's design-document example, step by step: hits, free queue order, allocation order;
- the public bug cases: k * block_size prompts, two identical prompts in one step, a hit at the
  head of the free queue, a prompt shorter than a block, a colliding hash, re-prefill after preemption;
- after every step: free iff refcount 0, every cached hash names the tokens its block holds, no
  block twice on the free queue; all free at the end.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.core.block_manager import PagedBlockManager
from engine.core.prefix_cache import hash_block_tokens
from engine.report import ALLOCATE, CACHE_HIT, EVICT
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceGroup, fork_samples

GREEDY = SamplingParams(max_tokens=4, ignore_eos=True)


def events(report, kind):
    return [e for e in report.events if e.kind == kind]


def run(engine, prompts, params=GREEDY):
    ids = [engine.add_request(p, params) for p in prompts]
    reports = []
    while engine.has_unfinished_requests():
        reports.append(engine.step())
    return [engine.get_output(i) for i in ids], reports


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    def make(**overrides):
        config = dict(model=str(tiny_llama_dir), dtype="float64", block_size=4, num_gpu_blocks=10)
        return LLMEngine(EngineConfig(**(config | overrides)))

    return make


# ---- vLLM's design-document example (docs/design/prefix_caching.md), on the real engine ----------

def test_vllm_design_doc_example(tiny):
    engine = tiny()  # block size 4, 10 blocks: handed out 0, 1, 2, ... from an empty pool
    kv = engine.kv
    r0 = engine.add_request(list(range(100, 115)), SamplingParams(max_tokens=4, ignore_eos=True))  # 15 tokens
    step = engine.step()  # Time 1: 4 blocks, 3 full and cached, the 4th holds 3 tokens
    assert [e.block_id for e in events(step, ALLOCATE)] == [0, 1, 2, 3]
    assert [b for b in range(10) if kv.prefix_cache.block_hash[b]] == [0, 1, 2]
    engine.step()  # token 16 fills block 3: cached
    assert [b for b in range(10) if kv.prefix_cache.block_hash[b]] == [0, 1, 2, 3]
    # Time 4: request 1, 14 prompt tokens of which the first 10 are request 0's: 2 blocks hit (8
    # tokens); the 3rd block matches only 2 of its 4 tokens.
    r1 = engine.add_request(list(range(100, 110)) + [200, 201, 202, 203], SamplingParams(max_tokens=3, ignore_eos=True))
    step = engine.step()  # Time 3 as well: request 0 needs block 4 to decode on
    assert [(e.request_id, e.block_id, e.logical_index) for e in events(step, CACHE_HIT)] == [(r1, 0, 0), (r1, 1, 1)]
    assert [(e.request_id, e.block_id) for e in events(step, ALLOCATE)] == [(r0, 4), (r1, 5), (r1, 6)]
    assert [s.num_tokens for s in step.scheduled if s.request_id == r1] == [6]  # only the uncached tokens
    step = engine.step()  # Time 5: request 0 finishes; blocks 4, 3, 2 return in reverse, 0 and 1 are held by request 1
    assert step.finished == {r0: "length"}
    assert kv.free_queue() == [7, 8, 9, 4, 3, 2]
    step = engine.step()  # Time 6: request 1 finishes
    assert step.finished == {r1: "length"}
    assert kv.free_queue() == [7, 8, 9, 4, 3, 2, 6, 5, 1, 0]
    assert step.memory.cached_free_slots == 4 * len(kv.cached_free_blocks()) and {0, 1, 2, 3} <= set(kv.cached_free_blocks())
    # Time 7: request 2, 29 tokens, the first 12 request 0's: 0, 1, 2 hit and are touched off the
    # queue first (7 8 9 4 3 6 5), then 5 new blocks come from its head: 7, 8, 9, 4, 3 (3 evicted).
    r2 = engine.add_request(list(range(100, 112)) + list(range(300, 317)), SamplingParams(max_tokens=1, ignore_eos=True))
    step = engine.step()
    assert [e.block_id for e in events(step, CACHE_HIT)] == [0, 1, 2]
    assert [e.block_id for e in events(step, ALLOCATE)] == [7, 8, 9, 4, 3]
    assert [e.block_id for e in events(step, EVICT)] == [3]
    assert engine.get_output(r2).num_cached_tokens == 12 and engine.get_output(r1).num_cached_tokens == 8
    stats = engine.prefix_cache_stats()
    assert (stats.queries, stats.hits) == (15 + 14 + 29, 8 + 12)


# ---- public bug cases ------------------------------------------------------------------------------

def test_a_prompt_of_whole_blocks_sent_twice_recomputes_its_last_block(tiny):
    """vLLM #11186, nano-vllm #144: a fully cached prompt still computes its last token."""
    on, off = tiny(num_gpu_blocks=16), tiny(num_gpu_blocks=16, enable_prefix_caching=False)
    prompt = list(range(500, 508))  # 2 blocks of 4
    first, _ = run(on, [prompt])
    again, reports = run(on, [prompt])
    assert again[0].num_cached_tokens == 4  # block 0; block 1 holds the last token, recomputed
    assert reports[0].scheduled[0].num_tokens == 4
    assert again[0].token_ids == first[0].token_ids == run(off, [prompt])[0][0].token_ids


def test_two_identical_prompts_in_one_step_neither_hits_and_are_cached_once(tiny):
    engine = tiny(num_gpu_blocks=16)
    prompt = list(range(600, 613))  # 3 full blocks + 1 token
    outs, reports = run(engine, [prompt, prompt])
    assert not events(reports[0], CACHE_HIT), "a request hit KV being written in the same step"
    assert outs[0].token_ids == outs[1].token_ids
    cache = engine.kv.prefix_cache
    assert len(cache.cached_blocks) == len(set(cache.cached_blocks.values())) == sum(1 for h in cache.block_hash if h)


def test_a_hit_at_the_head_of_the_free_queue_is_not_evicted_by_its_own_allocation(tiny):
    engine, off = tiny(num_gpu_blocks=4), tiny(num_gpu_blocks=4, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    run(engine, [list(range(700, 704))], params)  # block 0 cached; queue 1 2 3 0
    run(engine, [list(range(800, 811))], params)  # takes 1 2 3; queue 0 3 2 1
    assert engine.kv.free_queue()[0] == 0 and engine.kv.prefix_cache.block_hash[0]
    prompt = list(range(700, 704)) + list(range(900, 907))
    outs, reports = run(engine, [prompt], params)
    assert [e.block_id for e in events(reports[0], CACHE_HIT)] == [0]
    assert 0 not in [e.block_id for e in events(reports[0], EVICT)]
    assert [e.block_id for e in events(reports[0], ALLOCATE)] == [3, 2]
    assert outs[0].token_ids == run(off, [prompt], params)[0][0].token_ids


def test_a_prompt_shorter_than_a_block_never_hits(tiny):
    engine = tiny()
    run(engine, [[10, 11, 12]])
    outs, reports = run(engine, [[10, 11, 12]])
    assert outs[0].num_cached_tokens == 0 and not events(reports[0], CACHE_HIT)
    assert reports[0].scheduled[0].num_tokens == 3


def test_a_colliding_hash_never_serves_another_prompts_kv(tiny):
    engine, off = tiny(num_gpu_blocks=16), tiny(num_gpu_blocks=16, enable_prefix_caching=False)
    engine.kv.prefix_cache.hash_fn = lambda parent, token_ids, extra: b"every block collides"
    a, b = list(range(100, 109)), list(range(200, 209))
    run(engine, [a])
    outs, reports = run(engine, [b])
    assert not events(reports[0], CACHE_HIT), "a hit on a hash alone, without comparing token ids"
    assert outs[0].token_ids == run(off, [b])[0][0].token_ids
    # Same first block, other second block: block 0 is found (its tokens match), block 1 is not.
    outs, reports = run(engine, [a[:4] + list(range(300, 305))])
    assert [e.block_id for e in events(reports[0], CACHE_HIT)] == [0]  # request a's block 0, the map's one entry


def test_a_preempted_request_re_prefills_from_its_own_cached_blocks(tiny):
    """nano-vllm #211: the tokens to compute are counted after the cache lookup, not before."""
    def two_requests(engine):
        return run_each(engine, [(list(range(100, 107)), 10), (list(range(200, 212)), 6)])

    on, off = tiny(num_gpu_blocks=6), tiny(num_gpu_blocks=6, enable_prefix_caching=False)
    outs, reports = two_requests(on)
    assert [r.preempted for r in reports if r.preempted] == [[outs[1].request_id]]  # the newest, when the pool fills
    assert [o.token_ids for o in outs] == [o.token_ids for o in two_requests(off)[0]]
    re_prefill = next(s for r in reports for s in r.scheduled if s.request_id == outs[1].request_id and s.phase == "prefill" and r.step > 0)
    stats = on.prefix_cache_stats()
    assert stats.preempted_hits == 8 and re_prefill.num_tokens == re_prefill.context_len - 8  # its 2 blocks not yet evicted
    assert stats.hits == 0 and stats.queries == 7 + 12  # re-prefill hits counted apart
    assert on.kv.allocator.num_free == 6


def run_each(engine, prompts_and_max_tokens):
    ids = [engine.add_request(p, SamplingParams(max_tokens=m, ignore_eos=True)) for p, m in prompts_and_max_tokens]
    reports = []
    while engine.has_unfinished_requests():
        reports.append(engine.step())
    return [engine.get_output(i) for i in ids], reports


def test_re_prefill_at_block_size_plus_one_tokens():
    kv = PagedBlockManager(num_blocks=4, block_size=4, enable_caching=True)
    seq = Sequence(0, 5, max_len=8, token_ids=[1, 2, 3, 4, 5])
    kv.allocate(seq)
    seq.num_computed_tokens = 5
    kv.cache_blocks([seq])
    kv.free(seq)
    seq.num_computed_tokens = 0
    blocks, num_computed = kv.get_computed_blocks(seq)
    assert num_computed == 4 and kv.num_prefill_tokens(seq, blocks) == 1
    kv.allocate(seq, computed_blocks=blocks)
    assert len(seq.block_table) == 2 and seq.block_table[0] == blocks[0]


# ---- the default model: outputs and logits unchanged ----------------------------------------------

SYSTEM = ("You are a careful assistant for a library. Answer in one short sentence. Examples: "
          "Q: Where are the maps? A: On the second floor, by the windows. "
          "Q: Can I renew a book online? A: Yes, from your account page. ")
QUESTIONS = ["When does the library open?", "Can I bring my dog?", "Is there free wifi?", "Where can I print?"]


def chat(question):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def common_prefix(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("num_gpu_blocks", [512, 14])
def test_default_model_greedy_outputs_do_not_change(num_gpu_blocks):
    params = SamplingParams(max_tokens=8)
    outs = {}
    for caching in (True, False):
        engine = LLMEngine(EngineConfig(block_size=8, num_gpu_blocks=num_gpu_blocks, max_num_seqs=3, enable_prefix_caching=caching))
        first, _ = run(engine, [chat(QUESTIONS[0])], params)  # the system prompt is cached after this one
        results, reports = run(engine, [chat(q) for q in QUESTIONS[:3]], params)
        outs[caching] = [r.token_ids for r in first + results], results
    assert outs[True][0] == outs[False][0]
    results = outs[True][1]
    shared = [common_prefix(r.prompt_token_ids, first[0].prompt_token_ids) for r in results]
    if num_gpu_blocks == 512:  # nothing evicted: every full block of the shared prefix hits
        assert [r.num_cached_tokens for r in results] == [8 * ((shared[0] - 1) // 8)] + [8 * (n // 8) for n in shared[1:]]
    else:
        assert any(r.num_preemptions for r in results), "the small pool was meant to preempt"
        assert all(r.num_cached_tokens > 0 for r in results)


def test_logits_of_the_uncached_suffix_match_the_uncached_run():
    engines = {c: LLMEngine(EngineConfig(block_size=8, enable_prefix_caching=c)) for c in (True, False)}
    logits = {}
    for caching, engine in engines.items():
        run(engine, [chat(QUESTIONS[0])], SamplingParams(max_tokens=1))
        rows = []
        execute = engine.runner.execute
        engine.runner.execute = lambda *a, **k: rows.append(execute(*a, **k)) or rows[-1]  # records, computes
        outs, reports = run(engine, [chat(QUESTIONS[1])], SamplingParams(max_tokens=4))
        logits[caching] = torch.cat(rows)
        computed = reports[0].scheduled[0].num_tokens
        assert (computed < len(outs[0].prompt_token_ids)) == caching
    # The two runs multiply different row counts (the uncached prompt's, the suffix's), which on an Intel
    # CPU go through different matmuls (MKL above 64 rows, the engine's kernel below): fp32 rounding
    # differs by ~1e-4 on logits of ~10. A wrong block would be off by whole units.
    difference = (logits[True] - logits[False]).abs().max()
    assert difference < 1e-3, difference


def test_only_a_prefill_with_nothing_cached_reads_its_own_k_and_v(tiny):
    """A prompt with nothing in the cache attends over the step's own K and V (the backend's
    ``prefill_varlen``); one that starts after a prefix-cache hit reads its context through the block
    table (``prefill``); both give the uncached run's tokens."""
    engine = tiny(enable_prefix_caching=True, num_gpu_blocks=16)
    calls = []
    backend = engine.runner.backend
    spy = lambda name, fn: lambda *a, **k: calls.append(name) or fn(*a, **k)  # noqa: E731  (records, computes)
    engine.runner.backend = dataclasses.replace(backend, prefill=spy("paged", backend.prefill),
                                                prefill_varlen=spy("varlen", backend.prefill_varlen))
    prompt = list(range(1, 14))  # 13 tokens: 3 whole blocks of 4 go into the cache
    first, _ = run(engine, [prompt])
    assert set(calls) == {"varlen"}
    calls.clear()
    second, reports = run(engine, [prompt + [20, 21]])
    assert reports[0].scheduled[0].num_tokens == 3 and set(calls) == {"paged"}  # 12 tokens hit, 3 computed
    plain, _ = run(tiny(), [prompt, prompt + [20, 21]])
    assert [o.token_ids for o in first + second] == [o.token_ids for o in plain]


# ---- properties after every step (model-free, groups too) -----------------------------------------

def check_prefix_cache_invariants(kv: PagedBlockManager, scheduler: Scheduler) -> None:
    alloc, cache, bs = kv.allocator, kv.prefix_cache, kv.block_size
    free = Counter(alloc.free_blocks)
    assert all(n == 1 for n in free.values()), "a block is on the free queue twice"
    held = Counter(b for g in scheduler.running for s in g.unfinished_seqs() for b in s.block_table)
    for block in range(kv.num_blocks):
        assert (block in free) == (alloc.ref_counts[block] == 0), f"block {block}: free iff refcount 0"
        assert alloc.ref_counts[block] == held[block]
    for block_hash, block in cache.cached_blocks.items():
        assert cache.block_hash[block] == block_hash
        assert cache.hash_fn(cache.parent_hash[block], cache.block_token_ids[block], ()) == block_hash
    for group in scheduler.running:  # a cached block in a table holds that table's tokens there
        for seq in group.unfinished_seqs():
            for i, block in enumerate(seq.block_table):
                if cache.block_hash[block] is not None:
                    assert cache.block_token_ids[block] == tuple(seq.token_ids[i * bs : (i + 1) * bs])
    usage = kv.usage(scheduler.running, None)
    assert usage.cached_free_slots == bs * sum(1 for b in alloc.free_blocks if cache.block_hash[b])


def model_free_step(scheduler: Scheduler, kv: PagedBlockManager, rng: random.Random, next_seq_id) -> None:
    batch = scheduler.schedule()
    seqs = batch.prefill_seqs + batch.decode_seqs
    for seq in seqs:
        seq.num_computed_tokens = seq.num_tokens
    kv.cache_blocks(seqs)
    for group in list(scheduler.running):
        fork_samples(group, scheduler.fork, next_seq_id)  # after the prompt's one prefill
        for seq in group.unfinished_seqs():
            seq.append_token(rng.randrange(3))  # a tiny vocabulary: outputs repeat, so they hit too
            done = seq.num_tokens >= seq.max_len or (not group.is_single and rng.random() < 0.05)
            if done and len(group.unfinished_seqs()) > 1:
                scheduler.finish_seq(seq, "stop")
            elif done:
                scheduler.finish(group, "length")
                break


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 20), st.integers(1, 20), st.integers(1, 3)), min_size=1, max_size=8),
    block_size=st.sampled_from([1, 2, 4]),
    num_blocks=st.integers(8, 40),
    max_num_seqs=st.integers(1, 4),
    seed=st.integers(0, 1000),
)
def test_prefix_cache_invariants_hold_after_every_step(requests, block_size, num_blocks, max_num_seqs, seed):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3) for _ in range(12)] for _ in range(3)]  # shared system prompts
    kv = PagedBlockManager(num_blocks, block_size, shuffle_seed=seed, enable_caching=True)
    scheduler = Scheduler(kv, max_num_seqs, max_num_batched_tokens=10_000)
    ids = iter(range(1000, 10**6))
    for i, (prefix, prompt, output, n) in enumerate(requests):
        tokens = prefixes[prefix][: prompt] + [rng.randrange(3) for _ in range(prompt - 12)]
        seq = Sequence(i, prompt, max_len=min(prompt + output, num_blocks * block_size), seq_id=next(ids), token_ids=tokens)
        if prompt + 1 > seq.max_len:
            continue
        group = SequenceGroup(i, [seq], SamplingParams(n=n))
        if kv.fits_ever(group):
            scheduler.add(group)
    steps = 0
    while scheduler.has_unfinished():
        model_free_step(scheduler, kv, rng, lambda: next(ids))
        check_prefix_cache_invariants(kv, scheduler)
        steps += 1
        assert steps < 5_000, "the scheduler stopped making progress"
    assert kv.allocator.num_free == num_blocks, "blocks leaked"


def test_the_block_hash_is_stable_and_covers_the_prefix():
    h0 = hash_block_tokens(None, [1, 2, 3, 4])
    assert h0 == hash_block_tokens(None, [1, 2, 3, 4]) and len(h0) == 32
    assert hash_block_tokens(h0, [5, 6]) != hash_block_tokens(hash_block_tokens(None, [9, 2, 3, 4]), [5, 6])
    assert hash_block_tokens(None, [1, 2], ("salt",)) != hash_block_tokens(None, [1, 2])
    # Fixed across processes and machines (SHA-256 of a canonical encoding, not Python's salted hash()).
    assert h0.hex() == "a54f137301e6a1561ab08adead70f41ce255d7d31261b93b0466ba42a7f14321"


def test_prefix_caching_with_the_contiguous_allocator_is_refused():
    with pytest.raises(ValueError, match="enable_prefix_caching needs allocator='paged'"):
        EngineConfig(allocator="contiguous", enable_prefix_caching=True)
    assert EngineConfig(allocator="contiguous").enable_prefix_caching is False
    assert EngineConfig().enable_prefix_caching is True


# ---- the simulator: shared-prefix workloads (Figure 16's memory side) -----------------------------

def test_simulator_shared_prefix_is_held_once_and_a_sub_block_prefix_never_hits():
    from engine.sim.simulator import SimulationConfig, simulate
    from engine.sim.workloads import make_workload

    requests = make_workload("translation", 200, seed=1, max_model_len=1024)
    small = dict(requests=requests, kv_slots=3000, max_model_len=1024, max_num_seqs=64)
    cached = simulate(**small, shared_prefix=160)
    assert cached.completed == 200 and cached.memory_saved_by_sharing > 0.3
    oracle = simulate(**small, shared_prefix=160, allocator="contiguous", reservation="oracle")
    assert oracle.memory_saved_by_sharing == 0 and cached.mean_concurrent_requests > 1.5 * oracle.mean_concurrent_requests
    assert simulate(**small, shared_prefix=8).memory_saved_by_sharing == 0  # shorter than a block of 16
    with pytest.raises(ValueError, match="shared_prefix must be a number of tokens"):
        SimulationConfig(shared_prefix=-1)


def test_reproduce_figure16_orders_like_the_paper():
    from engine.experiments.figures import format_figure16_table, reproduce_figure16

    rows = reproduce_figure16(num_requests=300, kv_slots=6000, throughput_requests=150, rates=(2.0, 8.0, 16.0, 32.0))
    ratios = {r["prefix"]: r["batch_ratio_over_orca_oracle"] for r in rows if r["system"] == "vLLM"}
    assert 1 < ratios["1-shot"] < ratios["5-shot"]  # the longer prefix gains more, as in Figure 16
    tput = {r["prefix"]: r["throughput_ratio_over_orca_oracle"] for r in rows if r["system"] == "vLLM"}
    assert 1 <= tput["1-shot"] < tput["5-shot"], tput  # and in throughput too
    table = format_figure16_table(rows)
    assert "1.67x" in table and "3.58x" in table and "time model" in table and f"{tput['5-shot']:.2f}x" in table


def test_the_event_log_names_hits_and_evictions_in_both_languages(tiny):
    from visualize.pool import event_log_rows

    engine = tiny(num_gpu_blocks=4)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    run(engine, [list(range(700, 704))], params)
    run(engine, [list(range(800, 811))], params)
    _, reports = run(engine, [list(range(700, 704)) + list(range(900, 907))], params)
    en = [(r["event"], r["detail"]) for r in event_log_rows(reports[0], "en") if r["kind"] in (CACHE_HIT, EVICT)]
    zh = [(r["event"], r["detail"]) for r in event_log_rows(reports[0], "zh") if r["kind"] in (CACHE_HIT, EVICT)]
    assert en[0] == ("cache hit", "logical block 0 → cached block 0, not computed")
    # Blocks 3 and 2 are allocated; only 2 (full in the second request) was cached: it is evicted.
    assert [e for e, _ in en] == ["cache hit", "evict"] and [e for e, _ in zh] == ["缓存命中", "驱逐"]
    assert en[1][1].startswith("cached block 2 reused") and zh[1][1].startswith("已缓存的块 2")
