"""The hybrid KV cache manager (engine/core/kv_cache_coordinator.py, vLLM v1's): layers grouped as
vLLM groups them, one block table per group over one pool, sliding-window blocks freed out of the
window; refcounts, bounds and no leaks under preemption (recompute and swap), chunked prefill,
forks and prefix caching, on the real scheduler without a model."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from engine import SamplingParams
from engine.core.block_manager import PagedBlockManager
from engine.core.kv_cache_coordinator import HybridKVCacheCoordinator, make_kv_cache_manager
from engine.core.kv_cache_interface import (FULL_ATTENTION, SLIDING_WINDOW, gemma3_layer_types, get_kv_cache_config,
                                            get_kv_cache_groups, kv_bytes_per_request, layer_specs)
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus
from engine.core.single_type_kv_cache_manager import NULL_BLOCK, SlidingWindowManager
from engine.report import ALLOCATE, CACHE_HIT, FREE, SWAP_IN
from engine.runfile import Workload, WorkloadRequest
from tests.test_swap_chunked import model_free_step


def gemma3_config(num_blocks: int, block_size: int, window: int = 512, num_layers: int = 18, pattern: int = 6):
    types = gemma3_layer_types(num_layers, pattern)
    specs = layer_specs(num_layers, block_size, 1, 256, sliding_window=window, layer_types=types)
    return get_kv_cache_config(specs, num_blocks)


def test_gemma3_layers_group_as_vllm_groups_them():
    """15 sliding + 3 full layers: groups of 3 (the fewer type's count), 5 sliding then 1 full, and
    layer j of every group shares KV tensor j."""
    config = gemma3_config(100, 16)
    kinds = [g.kv_cache_spec.attention_type for g in config.kv_cache_groups]
    assert kinds == [SLIDING_WINDOW] * 5 + [FULL_ATTENTION]
    assert [g.layer_names for g in config.kv_cache_groups] == [
        (0, 1, 2), (3, 4, 6), (7, 8, 9), (10, 12, 13), (14, 15, 16), (5, 11, 17)]
    assert [t.shared_by for t in config.kv_cache_tensors] == [(0, 3, 7, 10, 14, 5), (1, 4, 8, 12, 15, 11), (2, 6, 9, 13, 16, 17)]
    assert config.tensor_index(11) == 1 and config.is_hybrid
    one = get_kv_cache_groups(layer_specs(30, 16, 3, 64))
    assert len(one) == 1 and one[0].layer_names == tuple(range(30)), "the default model: one group of all its layers"
    with pytest.raises(ValueError, match="sliding_window"):
        layer_specs(2, 16, 1, 64, layer_types=[SLIDING_WINDOW, FULL_ATTENTION])


def test_one_group_is_the_paged_allocator_itself():
    config = get_kv_cache_config(layer_specs(30, 16, 3, 64), 64)
    assert type(make_kv_cache_manager(config, 64, 16)) is PagedBlockManager
    assert type(make_kv_cache_manager(None, 64, 16)) is PagedBlockManager


def test_kv_bytes_per_request_counts_the_window_once_past_it():
    specs = layer_specs(18, 16, 1, 256, sliding_window=512, layer_types=gemma3_layer_types())
    page = 2 * 16 * 256 * 4
    assert kv_bytes_per_request(specs, 512) == 18 * 32 * page
    # 4,096 tokens: full layers 256 blocks each; sliding layers keep blocks 224..255 (32) and drop 224
    assert kv_bytes_per_request(specs, 4096) == (3 * 256 + 15 * 32) * page


def test_a_decoding_sliding_group_stays_bounded_while_the_full_group_grows():
    """One request of a 40-token prompt, window 8, blocks of 4, on Gemma 3's pattern of 6 layers (5
    sliding groups and 1 full, of 1 layer each): the sliding groups free blocks as
    the window moves (FREE events naming the group), the full group keeps every block."""
    config = gemma3_config(200, 4, window=8, num_layers=6)
    kv = HybridKVCacheCoordinator(config, 4)
    scheduler = Scheduler(kv, 4, 10_000)
    seq = Sequence(0, 40, max_len=80, token_ids=list(range(40)))
    scheduler.add(SequenceGroup(0, [seq]))
    ids = iter(range(100, 1000))
    in_use = []
    while scheduler.has_unfinished():
        batch, _, _ = model_free_step(scheduler, lambda: next(ids))
        if scheduler.running:
            groups = kv.kv_groups(scheduler.running)
            in_use.append([g.num_blocks_in_use for g in groups])
    sliding, full = [u[0] for u in in_use], [u[-1] for u in in_use]
    bound = -(-8 // 4) + 1
    assert sliding[0] == 10 and max(sliding[1:]) <= bound, "the prompt's blocks, then the window's"
    assert full == sorted(full) and full[-1] == 20, "the full group keeps all 80 tokens' blocks"
    freed = [e for e in kv.events if e.kind == FREE and e.detail == "out of the sliding window"]
    assert freed and {e.kv_cache_group for e in freed} == {0, 1, 2, 3, 4}, "the 5 sliding groups (of 6: 1 layer each) free, and say which"
    assert kv.allocator.num_free == 199


def check_hybrid_pools(kv: HybridKVCacheCoordinator, scheduler: Scheduler, decoded: set[int]) -> None:
    """Every block in one place across all groups' tables, refcount = tables holding it, the null
    block never counted; a sliding table's nulls lead it; a decoding sliding table within the window."""
    for allocator, groups in ((kv.allocator, scheduler.running), (kv.cpu_allocator, scheduler.swapped)):
        if allocator is None:
            continue
        held = Counter(b for g in groups for s in g.unfinished_seqs() for gi in range(kv.num_kv_cache_groups)
                       for b in s.block_tables_of(gi) if b != NULL_BLOCK)
        free = set(allocator.free_blocks)
        assert NULL_BLOCK not in free and allocator.ref_counts[NULL_BLOCK] == 0
        for block in range(1, allocator.num_blocks):
            assert allocator.ref_counts[block] == held[block], f"block {block}: refcount {allocator.ref_counts[block]}, {held[block]} tables"
            assert (block in free) == (held[block] == 0)
    for group in scheduler.running:
        for seq in group.unfinished_seqs():
            for gi, m in enumerate(kv.managers):
                table = seq.block_tables_of(gi)
                if not isinstance(m, SlidingWindowManager):
                    assert NULL_BLOCK not in table
                    continue
                real = [b for b in table if b != NULL_BLOCK]
                assert table[len(table) - len(real):] == real, "null entries lead a sliding table"
                if seq.seq_id in decoded:
                    assert len(real) <= -(-m.sliding_window // m.block_size) + 1, f"sliding table {table} outgrew its window"


def check_block_contents(kv: HybridKVCacheCoordinator, scheduler: Scheduler, events, written: dict[int, tuple]) -> None:
    """Every full prompt block a table points at holds that table's tokens: written by it (allocated
    this run since) or, a prefix-cache hit, by the request that computed the same tokens before."""
    for e in events:
        if e.kind in (ALLOCATE, SWAP_IN):
            written.pop(e.block_id if e.kind == ALLOCATE else e.dst_block_id, None)
    bs = kv.block_size
    for group in scheduler.running:
        for seq in group.unfinished_seqs():
            for gi in range(kv.num_kv_cache_groups):
                for i, block in enumerate(seq.block_tables_of(gi)):
                    if block == NULL_BLOCK or (i + 1) * bs > min(seq.num_computed_tokens, len(seq.token_ids)):
                        continue
                    tokens = tuple(seq.token_ids[i * bs : (i + 1) * bs])
                    assert written.setdefault(block, tokens) == tokens, f"group {gi}: block {block} holds other tokens"


@settings(max_examples=80, deadline=None)
@given(
    requests=st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30), st.integers(1, 2)), min_size=2, max_size=6),
    block_size=st.sampled_from([1, 2, 4]),
    window=st.integers(1, 12),
    num_blocks=st.integers(20, 60),
    num_cpu_blocks=st.integers(0, 30),
    chunked=st.booleans(),
    budget=st.integers(6, 48),
    caching=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_hybrid_invariants_hold_after_every_step(requests, block_size, window, num_blocks, num_cpu_blocks, chunked, budget,
                                                 caching, seed):
    rng = random.Random(seed)
    num_blocks = num_blocks * 4 // block_size  # the same tokens whatever the block size
    config = gemma3_config(num_blocks, block_size, window=window, num_layers=6, pattern=3 if seed % 3 else 6)  # 2 groups, or 6
    kv = HybridKVCacheCoordinator(config, block_size, shuffle_seed=seed, num_cpu_blocks=num_cpu_blocks, enable_caching=caching)
    budget = max(budget, 12) if chunked else 10_000
    scheduler = Scheduler(kv, 4, budget, preemption_mode="swap" if num_cpu_blocks else "recompute", enable_chunked_prefill=chunked)
    ids = iter(range(1000, 10**6))
    shared = [rng.randrange(4) for _ in range(24)]
    for i, (prompt, output, n) in enumerate(requests):
        tokens = (shared + [rng.randrange(4) for _ in range(prompt)])[:prompt]
        seq = Sequence(i, prompt, max_len=prompt + output, seq_id=next(ids), token_ids=tokens)
        group = SequenceGroup(i, [seq], SamplingParams(n=n))
        grown = kv.num_kv_cache_groups * n * -(-seq.max_len // block_size)  # recomputed alone at its last token
        if kv.fits_ever(group) and grown <= num_blocks - 1:
            scheduler.add(group)
    steps, written = 0, {}
    event(f"{len(scheduler.waiting)} requests fit")
    while scheduler.has_unfinished():
        batch, _, _ = model_free_step(scheduler, lambda: next(ids))
        if batch.preempted:
            event("preempted")
        events = kv.events.drain()
        if any(e.detail == "out of the sliding window" for e in events):
            event("freed out of the window")
        if any(e.kind == CACHE_HIT for e in events):
            event("prefix hit")
        check_hybrid_pools(kv, scheduler, {s.seq_id for s in batch.decode_seqs})
        check_block_contents(kv, scheduler, events, written)
        steps += 1
        assert steps < 3_000, "the scheduler stopped making progress"
    assert kv.allocator.num_free == num_blocks - 1, "GPU blocks leaked"
    if kv.cpu_allocator is not None:
        assert kv.cpu_allocator.num_free == num_cpu_blocks, "CPU blocks leaked"
    assert all(s.status is SequenceStatus.FINISHED for g in scheduler.running for s in g.seqs)


def test_a_sliding_group_hits_only_the_window_before_the_hit_end():
    """vLLM's sliding-window cache-hit rule: a second request with the same 24-token prompt (window
    8, blocks of 4) hits 5 blocks in the full group, and in the sliding group only the last
    ceil(7 / 4) = 2 blocks before the hit's end; the first 3 entries are the null block."""
    config = gemma3_config(64, 4, window=8, num_layers=6)
    kv = HybridKVCacheCoordinator(config, 4, enable_caching=True)
    scheduler = Scheduler(kv, 4, 10_000)
    tokens = list(range(24))
    ids = iter(range(100, 1000))
    first = Sequence(0, 24, max_len=26, token_ids=list(tokens))
    scheduler.add(SequenceGroup(0, [first]))
    while scheduler.has_unfinished():
        model_free_step(scheduler, lambda: next(ids))
    second = Sequence(1, 24, max_len=26, seq_id=1, token_ids=list(tokens))
    hit, num_tokens = kv.get_computed_blocks(SequenceGroup(1, [second]))
    assert num_tokens == 20
    sliding, full = hit.blocks[0], hit.blocks[-1]
    assert len(full) == 5 and NULL_BLOCK not in full
    assert sliding[:3] == [NULL_BLOCK] * 3 and NULL_BLOCK not in sliding[3:] and len(sliding) == 5
    kv.events.drain()
    group = SequenceGroup(1, [second])
    kv.allocate(group, None, hit)
    hits = [e for e in kv.events.drain() if e.kind == CACHE_HIT]
    assert sorted((e.kv_cache_group, e.logical_index) for e in hits if e.kv_cache_group == 0) == [(0, 3), (0, 4)]
    for e in hits:  # each event names the table entry the hit filled, after the sliding group's nulls
        assert second.block_tables_of(e.kv_cache_group)[e.logical_index] == e.block_id


def test_a_sliding_group_never_hits_a_block_cached_after_another_prefix():
    """A hash that ignores the parent (tests weaken it so) names [5, 6, 7, 8] alike after [1, 2, 3, 4]
    and after [9, 9, 9, 9]; the window (4 tokens, blocks of 4) needs only that one block before the
    hit's end. The hit compares the parent hash too, as the hash chain's lookup does: no hit."""
    kv = SlidingWindowManager(8, 4, null_block=True, enable_caching=True, sliding_window=4,
                              hash_fn=lambda parent, token_ids, extra: bytes(token_ids))
    scheduler = Scheduler(kv, 1, 100)
    ids = iter(range(100, 1000))
    scheduler.add(SequenceGroup(0, [Sequence(0, 9, max_len=10, token_ids=[1, 2, 3, 4, 5, 6, 7, 8, 0])]))
    while scheduler.has_unfinished():
        model_free_step(scheduler, lambda: next(ids))
    same = Sequence(1, 9, max_len=10, seq_id=1, token_ids=[1, 2, 3, 4, 5, 6, 7, 8, 0])
    other = Sequence(2, 9, max_len=10, seq_id=2, token_ids=[9, 9, 9, 9, 5, 6, 7, 8, 0])
    assert kv.find_longest_cache_hit(same, 2) == [NULL_BLOCK, kv.prefix_cache.cached_blocks[bytes([5, 6, 7, 8])]]
    assert kv.find_longest_cache_hit(other, 2) == []


@settings(max_examples=60, deadline=None)
@given(block_size=st.sampled_from([1, 2, 4]), window=st.integers(1, 12), num_blocks=st.integers(3, 60),
       chunk=st.one_of(st.none(), st.integers(1, 16)), prompt=st.integers(1, 200), six_groups=st.booleans())
def test_a_request_of_the_longest_length_finishes_alone(block_size, window, num_blocks, chunk, prompt, six_groups):
    """One token takes a slot in every group, so one request holds fewer tokens than the pool has
    slots: ``longest_request`` (an engine's max_model_len cap) counts each group's blocks as vLLM
    does, a sliding-window group at its window and a chunk with chunked prefill. A request of that
    length runs alone to its end; one token more would not fit."""
    config = gemma3_config(num_blocks, block_size, window=window, num_layers=6, pattern=6 if six_groups else 3)
    kv = HybridKVCacheCoordinator(config, block_size, max_num_batched_tokens=chunk)
    longest = kv.longest_request()
    assert kv.blocks_for_one_request(longest + 1) > kv.num_usable_blocks
    if longest < 2:
        return
    prompt = min(prompt, longest - 1)
    group = SequenceGroup(0, [Sequence(0, prompt, max_len=longest, token_ids=list(range(prompt)))])
    assert kv.fits_ever(group)
    scheduler = Scheduler(kv, 1, chunk or 10_000, enable_chunked_prefill=chunk is not None)
    scheduler.add(group)
    ids = iter(range(1000, 10**6))
    for _ in range(3 * longest):
        model_free_step(scheduler, lambda: next(ids))
        if not scheduler.has_unfinished():
            break
    assert not scheduler.has_unfinished(), f"stuck at {group.seqs[0].num_tokens} of {longest} tokens"
    assert group.seqs[0].num_tokens == longest and kv.allocator.num_free == kv.num_usable_blocks


def test_a_hybrid_refusal_says_each_token_takes_a_slot_in_every_group_and_what_would_hold_it(gemma_loaded):
    """Gemma 3 270M with an 8-token window (same weights), blocks of 4: 30 usable blocks and 6 groups
    hold one request of 20 tokens (max_model_len is capped there, below the 2048 asked), not 120.
    The refusal says why, and that 21 tokens need a pool of 37 blocks or chunks of at most 5 tokens
    (each sliding group then holds its window and a chunk: 4 blocks); with chunks of 4 the same pool
    holds 40. The app's Chinese reads the same numbers."""
    import copy
    import dataclasses

    from engine import EngineConfig, LLMEngine, SamplingParams
    from visualize.i18n import error_text

    config = copy.deepcopy(gemma_loaded.config)
    config.sliding_window = 8
    narrow = dataclasses.replace(gemma_loaded, config=config)

    def engine(**chunking):
        return LLMEngine(EngineConfig(model="gemma-3-270m", block_size=4, num_gpu_blocks=31, max_num_seqs=1, cpu_kernels=False, **chunking),
                         loaded_model=narrow)  # no step runs: torch, not the C++ kernels' packed weights

    whole, chunked = engine(), engine(enable_chunked_prefill=True, max_num_batched_tokens=4)
    assert (whole.max_model_len, chunked.max_model_len) == (20, 40) and whole.max_model_len_capped_by_pool
    groups = "as each token takes a slot in each of the model's 6 KV cache groups (30 blocks of 4 slots)"
    with pytest.raises(ValueError) as refused:
        whole.add_request(list(range(1000, 1020)))
    assert str(refused.value) == (f"prompt of 20 tokens leaves no room to generate: the KV pool holds 20 tokens of one request, {groups}; "
                                  "21 tokens need a pool of 37 blocks, or chunked prefill with max_num_batched_tokens of at most 5")
    assert error_text(str(refused.value), "zh").endswith("21 个 token 需要 37 块的 KV 池，或者开启分块预填充并让 max_num_batched_tokens 不超过 5")
    chunked.add_request(list(range(1000, 1020)), SamplingParams(max_tokens=20))
    with pytest.raises(ValueError) as refused:
        whole.add_request(list(range(1000, 1007)), SamplingParams(n=4, max_tokens=20))
    assert str(refused.value) == f"4 sequences of up to 20 tokens can never fit in the KV pool: each token takes a slot in each of the model's 6 KV cache groups (30 blocks of 4 slots)"
    assert "永远放不进 KV 池：每个 token 在模型的 6 个 KV 缓存组里各占一个槽位" in error_text(str(refused.value), "zh")


@pytest.mark.parametrize("refused", [dict(prefix_cache="radix"), dict(kv_offload_blocks=4)])
def test_the_radix_tree_and_the_cpu_tier_are_refused_saying_why_and_what_works(refused):
    with pytest.raises(ValueError) as error:
        make_kv_cache_manager(gemma3_config(64, 4, window=8, num_layers=6), 64, 4, enable_caching=True, **refused)
    message = str(error.value)
    assert "caches prefixes as a hash chain per KV cache group, as vLLM does: use prefix_cache='hash'" in message
    assert "kv_offload_blocks=0" in message and "SWARadixCache" in message


def test_the_simulator_takes_hybrid_specs_and_the_views_read_its_groups():
    """Gemma 3's pattern on the simulator: each step's kv_groups, the pool coloured by group, and the
    window's saving against all layers full (the app's views), in English and Chinese."""
    from engine.sim.simulator import simulate
    from engine.sim.workloads import Request
    from visualize.kv_groups import kv_group_rows, pool_by_group_spec, window_savings_frame, window_savings_spec

    specs = layer_specs(6, 4, 1, 8, sliding_window=8, layer_types=gemma3_layer_types(6, 3))  # 2 sliding groups, 1 full
    result = simulate(requests=[Request(0.0, 20, 30)], kv_slots=4 * 60, block_size=4, max_model_len=50, kv_cache_spec=specs,
                      record_steps=True)
    reports = result.step_reports
    assert all(len(r.kv_groups) == 3 for r in reports if r.scheduled)
    frame = window_savings_frame(reports)
    before_finish = frame.iloc[-2]  # the last step finished the request: its tables are gone
    assert before_finish.all_full == 3 * 12 and before_finish.in_use == 12 + 2 * 2, "48 tokens: 12 blocks a table, the window's 2"
    last = reports[-2]
    rows = kv_group_rows(last)
    assert any(r["null"] for r in rows if r["group"] < 2) and not any(r["null"] for r in rows if r["group"] == 2)
    for lang, words in (("en", ("sliding window 8", "full attention", "free")), ("zh", ("滑动窗口 8", "全注意力", "空闲"))):
        legend = pool_by_group_spec(last, 61, lang)["encoding"]["color"]["scale"]["domain"]
        assert all(any(w in d for d in legend) for w in words), legend
        assert window_savings_spec(frame, lang)["title"] in (t_ for t_ in ("What the sliding window saves", "滑动窗口省下的块"))


def test_a_gemma_run_reports_its_groups_and_a_run_file_keeps_them(gemma_loaded, tmp_path):
    """Gemma 3 270M with a 16-token window (same weights), blocks of 4: the engine's StepReport.kv_groups
    name 5 sliding-window groups bounded by the window and 1 full group that grows; FREE events name
    their group; a saved run reads back with its groups."""
    import copy
    import dataclasses

    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.runfile import Run, load_run, run_json

    config = copy.deepcopy(gemma_loaded.config)
    config.sliding_window = 16
    llm = LLMEngine(EngineConfig(model="gemma-3-270m", block_size=4, num_gpu_blocks=200, max_num_seqs=1),
                    loaded_model=dataclasses.replace(gemma_loaded, config=config))
    llm.add_request(list(range(1000, 1030)), SamplingParams(max_tokens=6, ignore_eos=True))
    reports = [llm.step() for _ in range(6)]
    groups = reports[-2].kv_groups  # the last step finished the request
    assert [g.attention_type for g in groups] == [SLIDING_WINDOW] * 5 + [FULL_ATTENTION]
    assert groups[5].layers == [5, 11, 17] and groups[5].num_blocks_in_use == 9, "34 tokens: 9 blocks of 4"
    assert all(g.num_blocks_in_use <= -(-16 // 4) + 1 for g in groups[:5])
    freed = {e.kv_cache_group for r in reports for e in r.events if e.detail == "out of the sliding window"}
    assert freed == {0, 1, 2, 3, 4}
    path = tmp_path / "run.json"
    path.write_text(run_json(Run(Workload([WorkloadRequest("ids", 6)]), dict(model_name="gemma-3-270m", block_size=4,
                                                                                num_blocks=llm.num_blocks, bytes_per_slot=llm.bytes_per_slot),
                                 {0: "ids"}, reports)), encoding="utf-8")
    assert load_run(path).steps == reports
