"""The radix-tree prefix cache (engine/core/radix_cache.py, SGLang's RadixAttention) on the real
scheduler and allocator: its invariants after every step under preemption (recompute and swap),
chunked prefill and forks; its eviction order; and greedy outputs equal to no caching and to the
hash chain on the default model."""

from __future__ import annotations

import random
from collections import Counter
from contextlib import nullcontext

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app_pages.presets import PRESETS, preset_settings
from app_pages.state import ChatTurns, Settings, add_next_chat_turn, add_workload
from engine import EngineConfig, LLMEngine, SamplingParams
from engine.config import SpeculativeConfig
from engine.core.block_manager import PagedBlockManager
from engine.core.radix_cache import RadixCache, RadixFreeQueue
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceGroup
from engine.core.sequence import fork_samples
from tests.test_swap_chunked import check_pools


def path_of(node):
    nodes = []
    while node.parent is not None:
        nodes.append(node)
        node = node.parent
    return nodes[::-1]


def check_radix_invariants(kv: PagedBlockManager, scheduler: Scheduler, written: dict[int, tuple]) -> None:
    """No evictable node is held, every node's lock count is the number of sequences holding it and
    equals its blocks' refcounts, and the tree's tokens are the tokens its blocks hold."""
    cache, alloc, bs = kv.prefix_cache, kv.allocator, kv.block_size
    running = [s for g in scheduler.running for s in g.unfinished_seqs()]
    holders = Counter()
    for seq in running:
        node = cache.seq_node.get(seq.seq_id)
        if node is None:
            continue
        path = path_of(node)
        holders.update(id(n) for n in path)
        blocks = [b for n in path for b in n.blocks]
        assert blocks == seq.block_table[: len(blocks)], f"sequence {seq.seq_id} does not hold its path's blocks"
        assert len(blocks) == kv.num_committed_blocks[seq.seq_id]
        assert [t for n in path for t in n.key] == seq.token_ids[: len(blocks) * bs]
    held_ids = {s.seq_id for s in running}
    assert set(cache.seq_node) <= held_ids, "a sequence that holds no blocks still locks a path"
    cached_free = set()
    for node in cache.nodes():
        assert node.blocks and len(node.key) == len(node.blocks) * bs
        assert node.parent.children[tuple(node.key[:bs])] is node
        assert node.lock_ref == holders[id(node)], f"node {node.node_id}: lock_ref {node.lock_ref}, {holders[id(node)]} holders"
        for j, block in enumerate(node.blocks):
            assert cache.node_of[block] is node
            assert alloc.ref_counts[block] == node.lock_ref, f"block {block}: refcount {alloc.ref_counts[block]}, lock_ref {node.lock_ref}"
            assert tuple(node.key[j * bs : (j + 1) * bs]) == written[block], f"block {block} holds other tokens than its node"
            if node.lock_ref == 0:
                cached_free.add(block)
        if node.lock_ref:  # a held node is never evictable, nor is any node above it
            assert not cache._evictable(node)
    assert sum(n is not None for n in cache.node_of) == sum(len(n.blocks) for n in cache.nodes())
    assert set(alloc.free_blocks.cached) == cached_free, "the free queue's cached blocks are the unlocked nodes' blocks"


def check_offload_tier(kv: PagedBlockManager, written: dict[int, tuple]) -> None:
    """The CPU tier holds at most its capacity, every CPU block once, the tokens of the GPU block it
    was copied from; a loaded block holds the tokens of the CPU block it came from."""
    tier = kv.offload
    assert len(tier.entries) + len(tier.free) == tier.num_blocks and not tier.pinned and not tier.copies_out
    assert sorted(list(tier.entries.values()) + tier.free) == list(range(tier.base, tier.base + tier.num_blocks))
    for block_hash, cpu in tier.entries.items():
        assert tier.meta[cpu][0] == block_hash
        assert written[("cpu", cpu)] == tier.meta[cpu][2], f"CPU block {cpu} holds other tokens than its entry"


def apply_copies(batch, written: dict) -> None:
    """What the step's copies do to the blocks' contents: offloads first, then loads."""
    for gpu, cpu in batch.kv_offload_out:
        written[("cpu", cpu)] = written[gpu]
    for cpu, gpu in batch.kv_offload_in:
        written[gpu] = written[("cpu", cpu)]


def record_written(kv: PagedBlockManager, seqs: list[Sequence], written: dict[int, tuple]) -> None:
    """What each full block holds, by the tables that wrote it (a free block keeps its last tokens)."""
    bs = kv.block_size
    for seq in seqs:
        for i in range(min(seq.num_computed_tokens, len(seq.token_ids)) // bs):
            written[seq.block_table[i]] = tuple(seq.token_ids[i * bs : (i + 1) * bs])


def model_free_step(scheduler: Scheduler, rng: random.Random, next_seq_id, written: dict[int, tuple]) -> None:
    """One engine step without a model (as tests/test_swap_chunked.py's), whose sampled tokens come
    from a vocabulary of 3, so that decoded blocks repeat and hit too, and samples end at random."""
    batch = scheduler.schedule()
    apply_copies(batch, written)
    ready = {s.seq_id for s in scheduler.update_from_output(batch)}
    record_written(scheduler.kv, batch.prefill_seqs + batch.decode_seqs, written)
    for group in list(scheduler.running):
        if group.seqs[0].seq_id in ready:  # after the prompt's one prefill
            ready.update(child.seq_id for child in fork_samples(group, scheduler.fork, next_seq_id))
        for seq in group.unfinished_seqs():
            if seq.seq_id in ready:
                seq.append_token(rng.randrange(3))
                if len(group.unfinished_seqs()) > 1 and rng.random() < 0.05:
                    scheduler.finish_seq(seq, "stop")
        if all(s.num_tokens >= s.max_len for s in group.unfinished_seqs()):
            scheduler.finish(group, "length")


@settings(max_examples=100, deadline=None)
@given(
    requests=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 30), st.integers(1, 30), st.integers(1, 3)), min_size=2, max_size=8),
    block_size=st.sampled_from([1, 2, 4]),
    num_blocks=st.integers(6, 40),
    num_cpu_blocks=st.integers(0, 30),
    max_num_seqs=st.integers(1, 5),
    chunked=st.booleans(),
    budget=st.integers(5, 64),
    cache=st.sampled_from(["radix", "radix", "hash"]),
    offload=st.sampled_from([0, 0, 1, 3, 12]),
    seed=st.integers(0, 1000),
)
def test_radix_invariants_hold_after_every_step(requests, block_size, num_blocks, num_cpu_blocks, max_num_seqs, chunked, budget,
                                                cache, offload, seed):
    rng = random.Random(seed)
    kv = PagedBlockManager(num_blocks, block_size, shuffle_seed=seed, num_cpu_blocks=num_cpu_blocks, enable_caching=True,
                           prefix_cache=cache, kv_offload_blocks=offload)
    budget = max(budget, max_num_seqs * 3) if chunked else 10_000
    mode = "swap" if num_cpu_blocks else "recompute"
    scheduler = Scheduler(kv, max_num_seqs, budget, preemption_mode=mode, enable_chunked_prefill=chunked)
    ids = iter(range(1000, 10**6))
    prefixes = [[rng.randrange(3) for _ in range(16)] for _ in range(3)]  # shared system prompts, a tiny vocabulary
    for i, (prefix, prompt, output, n) in enumerate(requests):
        tokens = (prefixes[prefix] + [rng.randrange(3) for _ in range(prompt)])[:prompt]
        seq = Sequence(i, prompt, max_len=min(prompt + output, num_blocks * block_size), seq_id=next(ids), token_ids=tokens)
        group = SequenceGroup(i, [seq], SamplingParams(n=n))
        if prompt + 1 <= seq.max_len and kv.fits_ever(group):
            scheduler.add(group)
    written: dict[int, tuple] = {}
    steps = 0
    while scheduler.has_unfinished():
        model_free_step(scheduler, rng, lambda: next(ids), written)
        check_pools(kv, scheduler)
        if offload:
            check_offload_tier(kv, written)
        if cache == "hash":
            continue
        check_radix_invariants(kv, scheduler, written)
        for group in scheduler.swapped + list(scheduler.waiting):
            assert all(s.seq_id not in kv.prefix_cache.seq_node for s in group.unfinished_seqs()), "a request off the GPU locks a path"
        steps += 1
        assert steps < 5_000, "the scheduler stopped making progress"
    assert kv.allocator.num_free == num_blocks, "blocks leaked"
    if cache == "hash":
        return
    assert not kv.prefix_cache.seq_node and all(n.lock_ref == 0 for n in kv.prefix_cache.nodes())


# ---- greedy outputs on the default model: radix = hash chain = no caching, on every preset of the app ----

def preset_config(name: str, caching: str | None) -> tuple[EngineConfig, list[tuple[str, int]], dict]:
    """The engine a preset runs on (app_pages/presets.py), greedy and cut short: at most 8 new tokens
    per request; the presets that preempt keep their pressure with 16 tokens in a pool of 12 blocks
    (4 prompts of 37 tokens fill it, and each needs a 4th block at its 12th token)."""
    preset = PRESETS[name]
    settings = preset_settings(name)
    pressure = settings["preemption_mode"] == "swap" or name == "preset_preemption"
    num_blocks, max_tokens = (12, 16) if pressure else (settings["num_blocks"], 8)
    config = EngineConfig(
        block_size=settings["block_size"], num_gpu_blocks=num_blocks, max_num_seqs=settings["max_batch"],
        preemption_mode=settings["preemption_mode"], enable_chunked_prefill=settings["chunked_prefill"],
        max_num_batched_tokens=settings["token_budget"] if settings["chunked_prefill"] else None,
        speculative_config=SpeculativeConfig(num_speculative_tokens=settings["spec_k"]) if settings["speculative"] else None,
        enable_prefix_caching=caching is not None, prefix_cache=caching or "hash",
        kv_offload_blocks=settings["kv_offload_blocks"] if caching else 0)
    rows = [(prompt, min(n, max_tokens)) for prompt, n in preset["rows"]]
    return config, rows, settings


def run_preset(loaded, name: str, caching: str | None):
    config, rows, settings = preset_config(name, caching)
    llm = LLMEngine(config, loaded_model=loaded)
    ids: list[int] = []
    first = rows[:1] if settings["chat"] else rows
    assert not add_workload(llm, first, 0.0, 0, settings["sharing"], settings["sharing_width"], ids)
    chat = ChatTurns(rows, request_id=ids[0]) if settings["chat"] else None
    chat_settings = Settings(temperature=0.0)
    reports = []
    while llm.has_unfinished_requests():
        reports.append(llm.step())
        if (turn := add_next_chat_turn(llm, chat, chat_settings)) is not None:
            ids.append(turn)
    outputs = [llm.get_output(i) for i in ids]
    tokens = [[c.token_ids for c in o.outputs] or o.token_ids for o in outputs]
    return tokens, outputs, reports


@pytest.fixture(scope="module")
def default_loaded():
    from engine.model_executor.model_loader import load_model

    return load_model(None)


# The default model's presets; the LPM preset's order is checked on a tiny model below (its outputs are the radix preset's kind).
@pytest.mark.parametrize("name", [n for n in PRESETS if "model" not in PRESETS[n] and n != "preset_lpm"])
def test_radix_gives_the_greedy_outputs_of_no_caching_and_of_the_hash_chain(default_loaded, name):
    runs = {caching: run_preset(default_loaded, name, caching) for caching in (None, "hash", "radix")}
    assert runs["radix"][0] == runs[None][0] == runs["hash"][0]
    if name in ("preset_preemption", "preset_swap"):
        assert any(r.preempted for r in runs["radix"][2]), "the small pool was meant to preempt"
    if name in ("preset_shared_system_prompt", "preset_multi_turn_chat"):
        hits = {c: sum(o.num_cached_tokens for o in runs[c][1]) for c in ("hash", "radix")}
        assert hits["radix"] >= hits["hash"] > 0


def test_a_two_block_cpu_tier_gives_the_greedy_outputs_of_none_on_a_multi_turn_workload(default_loaded):
    """Two chats of two turns, one request at a time, in a pool of 5 blocks of 4 tokens: each chat's
    turn evicts the other's blocks; with a tier of 2 blocks the next turn loads its first blocks
    back, and the full tier drops some. The tokens are those without a tier."""
    def run(**cache):
        engine = LLMEngine(EngineConfig(block_size=4, num_gpu_blocks=5, max_num_seqs=1, **cache), loaded_model=default_loaded)
        history, outputs, reports = {}, [], []
        for chat, first in (("A", 100), ("B", 300), ("A", 200), ("B", 400)):
            prompt = history.get(chat, []) + list(range(first, first + 6))
            rid = engine.add_request(prompt, SamplingParams(max_tokens=3, ignore_eos=True))
            while engine.has_unfinished_requests():
                reports.append(engine.step())
            outputs.append(engine.get_output(rid).outputs[0].token_ids)
            history[chat] = prompt + outputs[-1]
        return outputs, reports

    plain, _ = run()
    outputs, reports = run(kv_offload_blocks=2)  # the radix tree's tier: the model-free tests above and preset_radix_offload
    assert outputs == plain
    assert sum(len(r.kv_offload.loaded) for r in reports) == 2 and sum(r.kv_offload.dropped for r in reports) >= 1


# ---- the tree's eviction order, cache-aware scheduling, the CPU tier ------------------------------

def finish_request(scheduler: Scheduler, kv: PagedBlockManager, tokens: list[int], request_id: int) -> None:
    """Run one request of ``tokens`` (its prompt) through a prefill and one decode, then finish it."""
    seq = Sequence(request_id, len(tokens), max_len=len(tokens) + 1, seq_id=request_id, token_ids=list(tokens))
    scheduler.add(SequenceGroup(request_id, [seq], SamplingParams()))
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        scheduler.update_from_output(batch)
        seq.append_token(0)
        scheduler.finish(scheduler.running[0], "length")


def test_a_partial_match_splits_a_node_and_eviction_is_lru_over_leaves():
    kv = PagedBlockManager(8, 1, enable_caching=True, prefix_cache="radix")  # token granularity
    scheduler = Scheduler(kv, 1, 100)
    finish_request(scheduler, kv, [1, 2, 3, 5], 0)  # caches its prompt: one node 1 2 3 5
    finish_request(scheduler, kv, [1, 2, 4], 1)  # hits 1 2: the node splits there; 4 becomes a sibling of 3 5
    tree = {tuple(row["token_ids"]): row for row in kv.prefix_cache.tree()}
    assert set(tree) == {(1, 2), (3, 5), (4,)}
    assert tree[(3, 5)]["parent_id"] == tree[(4,)]["parent_id"] == tree[(1, 2)]["node_id"]
    assert all(row["lock_ref"] == 0 for row in tree.values())
    order, evicted = [], []
    for _ in range(8):  # what the allocator does for each new block: take the free queue's choice, evict it
        order.append(kv.allocator.allocate())
        evicted.append(kv.prefix_cache.evict(order[-1]) is not None)
    # Plain free blocks first, then the least recently used leaf's blocks from its end: 5 3 (the older
    # branch), then 4, and only then the shared 2 1, which became a leaf last.
    assert evicted == [False] * 3 + [True] * 5  # 3 plain free blocks, then the 5 cached ones
    assert order[3:] == [*tree[(3, 5)]["blocks"][::-1], *tree[(4,)]["blocks"], *tree[(1, 2)]["blocks"][::-1]]


def test_lpm_admits_the_longest_cached_prefix_first_and_a_starved_request_before_it():
    kv = PagedBlockManager(64, 2, enable_caching=True, prefix_cache="radix")
    scheduler = Scheduler(kv, 1, 1000, scheduling_policy="lpm", lpm_max_wait_steps=3)
    shared = list(range(100, 120))
    finish_request(scheduler, kv, shared + [1], 0)
    for rid, tokens in ((1, list(range(200, 221))), (2, shared + [2]), (3, shared + [3])):  # 1 shares nothing, came first
        scheduler.add(SequenceGroup(rid, [Sequence(rid, 21, max_len=23, seq_id=rid, token_ids=tokens)], SamplingParams()))
    admitted = []
    while scheduler.has_unfinished():
        batch = scheduler.schedule()
        admitted += batch.admissions
        scheduler.update_from_output(batch)
        for group in list(scheduler.running):
            group.seqs[0].append_token(0)
            if group.seqs[0].num_tokens >= group.seqs[0].max_len:
                scheduler.finish(group, "length")
    assert [(rid, reason) for rid, reason, _ in admitted] == [(2, "longest-prefix"), (1, "starved"), (3, "starved")]
    assert admitted[0][2] == 20 and admitted[1][2] == 0  # 1 shares nothing, yet goes before 3 once it waited 3 steps


def test_fcfs_records_no_admissions_and_lpm_needs_prefix_caching():
    kv = PagedBlockManager(16, 2, enable_caching=True)
    assert Scheduler(kv, 1, 100).schedule().admission_reasons is None
    with pytest.raises(ValueError, match="needs prefix caching"):
        EngineConfig(enable_prefix_caching=False, scheduling_policy="lpm")
    with pytest.raises(ValueError, match="prefix_cache must be one of hash, radix"):
        EngineConfig(prefix_cache="trie")
    with pytest.raises(ValueError, match="kv_offload_blocks must be a number of blocks"):
        EngineConfig(kv_offload_blocks=-1)


def test_a_cpu_tier_larger_than_the_memory_available_is_refused_naming_its_flag(tiny_llama_dir):
    """10^12 blocks of the tiny model's 2 layers (2 KV heads of 16, float32, blocks of 16: 8 KiB each)
    would take 7,629,394.5 GiB: refused before anything is reserved, naming --kv-offload-blocks, not
    the swap space it shares the host cache with."""
    from engine.model_executor.platform import available_host_memory

    assert available_host_memory() is not None
    with pytest.raises(ValueError, match=r"^kv_offload_blocks=1000000000000 \(--kv-offload-blocks\) needs 7,629,394.5 GiB of CPU memory "
                                         r"\(1,000,000,000,000 blocks of 8.0 KiB\), and [\d,.]+ GiB is available: give fewer blocks$"):
        LLMEngine(EngineConfig(model=str(tiny_llama_dir), kv_offload_blocks=10**12))


@pytest.mark.parametrize("cache", ["hash", "radix"])
def test_evicted_blocks_come_back_from_the_cpu_tier_with_the_same_outputs(tiny_llama_dir, cache):
    def make(**overrides):
        return LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float64", block_size=4, num_gpu_blocks=6, **overrides))

    prompts = [list(range(10, 23)), list(range(40, 53)), list(range(10, 23)) + [7]]  # the third hits the first, evicted by the second
    params = SamplingParams(max_tokens=3, ignore_eos=True)

    def run(engine):
        outs, reports = [], []
        for prompt in prompts:  # one at a time: the second evicts the first's blocks
            rid = engine.add_request(prompt, params)
            while engine.has_unfinished_requests():
                reports.append(engine.step())
            outs.append(engine.get_output(rid))
        return outs, reports

    plain, _ = run(make(enable_prefix_caching=False))
    dropped, _ = run(make(prefix_cache=cache))
    offloaded, reports = run(make(prefix_cache=cache, kv_offload_blocks=16))
    assert [o.token_ids for o in offloaded] == [o.token_ids for o in dropped] == [o.token_ids for o in plain]
    # The second prompt's 4 blocks evict the first's third full block: without the tier the third
    # prompt hits 2 blocks, with it all 3 (the third loaded back).
    assert dropped[2].num_cached_tokens == 8 and offloaded[2].num_cached_tokens == 12
    assert sum(len(r.kv_offload.offloaded) for r in reports) >= 1 and sum(len(r.kv_offload.loaded) for r in reports) == 1
    assert reports[-1].kv_offload.cpu_blocks <= 16


@pytest.mark.parametrize("cache", ["hash", "radix"])
def test_a_step_whose_copies_fail_leaves_no_offload_entry_and_no_unloaded_block_cached(tiny_llama_dir, cache):
    """A step that raises in its copies, after the scheduler queued an offload or a load back, is
    undone: the CPU tier forgets the blocks it never received, the GPU cache the blocks that were
    never loaded, and the retried requests give the outputs of no caching."""
    def make(**overrides):
        return LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float64", block_size=4, num_gpu_blocks=6, **overrides))

    prompts = [list(range(10, 23)), list(range(40, 53)), list(range(10, 23)) + [7]]  # as above: 2 evicts 1, 3 loads 1 back
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    plain, engine = make(enable_prefix_caching=False), make(prefix_cache=cache, kv_offload_blocks=16)
    swap, queued = engine.runner.swap, []

    def failing_swap(out, into):
        engine.runner.swap = swap
        queued.append((out, into))
        raise RuntimeError("the copy broke")

    def run(engine, prompt, fail):
        rid = engine.add_request(prompt, params)
        engine.runner.swap = failing_swap if fail else engine.runner.swap
        with pytest.raises(RuntimeError, match="the copy broke") if fail else nullcontext():
            while engine.has_unfinished_requests():
                engine.step()
        if fail:
            check(engine)
        while engine.has_unfinished_requests():
            engine.step()
        return engine.get_output(rid).token_ids

    def check(engine):
        out, into = queued[-1]
        assert out or into
        assert not {cpu for _, cpu in out} & set(engine.kv.offload.meta)
        assert not {gpu for _, gpu in into} & set(engine.prefix_cache_entries())
        assert not engine.kv.offload.step.offloaded and not engine.kv.offload.step.loaded

    outs = [run(engine, prompt, fail=i > 0) for i, prompt in enumerate(prompts)]
    assert outs == [run(plain, prompt, fail=False) for prompt in prompts]


def test_the_simulator_runs_the_token_workloads_on_either_cache_and_defaults_read_as_before():
    from engine.sim.simulator import simulate
    from engine.sim.workloads import make_workload

    first = make_workload("multiturn", 60, seed=1)
    assert [r.token_ids for r in first] == [r.token_ids for r in make_workload("multiturn", 60, seed=1)]  # seeded
    turns = [r for r in first if r.prompt_len > 100]
    assert any(r.token_ids[:50] == s.token_ids[:50] for r in turns for s in first if s is not r), "a later turn resends its history"
    fewshot = make_workload("fewshot", 40, seed=1)
    assert len({r.token_ids[:800] for r in fewshot}) == 4  # four few-shot prefixes
    run = dict(workload="multiturn", num_requests=150, kv_slots=3200, request_rate=2.0, cost_model="a100-opt-13b")
    results = {c: simulate(**run, prefix_cache=c) for c in ("hash", "radix")}
    offloaded = simulate(**run, prefix_cache="radix", kv_offload_blocks=400)
    for r in (*results.values(), offloaded):
        assert r.completed == 150 and r.prefix_cache_hit_rate == r.prefix_cache_hits / r.prefix_cache_queries > 0
    assert offloaded.kv_loaded_blocks > 0 and offloaded.prefix_cache_hit_rate > results["radix"].prefix_cache_hit_rate
    assert offloaded.summary()["config"]["kv_offload_blocks"] == 400
    plain = simulate(num_requests=20).summary()
    assert not {"prefix_cache", "scheduling_policy", "kv_offload_blocks", "enable_prefix_caching"} & set(plain["config"])
    assert "prefix_cache_hit_rate" not in plain


# ---- the CPU tier: every block holds the KV its table and its hash name ---------------------------

class KVContents:
    """What each physical block holds, model-free: for each slot, the token ids whose KV it holds
    (its token and every token before it: a position's K and V depend on its whole prefix). Written
    as the engine writes and copies: a step's copies to the CPU first (swap-outs, offloads), then
    back (swap-ins, loads), then its copy-on-writes, then the scheduled positions."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.slots: dict[tuple[str, int], list[tuple | None]] = {}
        self.loads: list[tuple[int, int]] = []  # the CPU tier's (cpu, gpu) loads so far

    def block(self, pool: str, block_id: int) -> list[tuple | None]:
        return self.slots.setdefault((pool, block_id), [None] * self.block_size)

    def step(self, scheduler: Scheduler) -> list[Sequence]:
        batch = scheduler.schedule()
        self.loads += batch.kv_offload_in
        for pairs, src, dst in ((batch.blocks_to_swap_out + batch.kv_offload_out, "gpu", "cpu"),
                                (batch.blocks_to_swap_in + batch.kv_offload_in, "cpu", "gpu"), (batch.blocks_to_copy, "gpu", "gpu")):
            for a, b in pairs:
                self.slots[(dst, b)] = list(self.block(src, a))
        bs = self.block_size
        for seq in batch.prefill_seqs + batch.decode_seqs:
            for pos in range(seq.num_computed_tokens, seq.num_computed_tokens + batch.num_tokens_of(seq)):
                self.block("gpu", seq.block_table[pos // bs])[pos % bs] = tuple(seq.token_ids[: pos + 1])
        return scheduler.update_from_output(batch)

    def prefix(self, pool: str, block_id: int) -> tuple | None:
        """The tokens whose KV the full block holds, through its own last token (None: its slots
        hold no one prefix)."""
        slots, bs = self.block(pool, block_id), self.block_size
        last = slots[-1]
        if last is None or any(slots[j] != last[: len(last) - bs + j + 1] for j in range(bs)):
            return None
        return last


def check_kv_contents(kv: PagedBlockManager, scheduler: Scheduler, contents: KVContents) -> None:
    """Each running sequence's computed positions hold its own tokens' KV; each cached GPU block and
    each CPU-tier block holds the KV its block hash names."""
    bs, cache = kv.block_size, kv.prefix_cache
    for group in scheduler.running:
        for seq in group.unfinished_seqs():
            for pos in range(seq.num_computed_tokens):
                block_id = seq.block_table[pos // bs]
                assert contents.block("gpu", block_id)[pos % bs] == tuple(seq.token_ids[: pos + 1]), \
                    f"request {seq.request_id}'s block {block_id} (logical {pos // bs}) holds another prefix's KV"

    def names(pool: str, block_id: int, block_hash: bytes) -> bool:
        prefix = contents.prefix(pool, block_id)
        return prefix is not None and cache.block_hashes(list(prefix), len(prefix) // bs, [])[-1] == block_hash

    for block_id, block_hash in enumerate(cache.block_hash):
        assert block_hash is None or names("gpu", block_id, block_hash), f"cached GPU block {block_id} holds other KV than its hash names"
    for block_hash, cpu in kv.offload.entries.items():
        assert names("cpu", cpu, block_hash), f"CPU tier block {cpu} holds other KV than its hash names"


def run_conversations(kv: PagedBlockManager, scheduler: Scheduler, chats: list[list[tuple[list[int], int]]], rng: random.Random,
                      vocab: int = 3) -> KVContents:
    """Multi-turn chats, model-free: each turn is ``(new tokens, output tokens)``, its prompt the chat
    so far (the last turn's prompt and output) and its new tokens; a chat's next turn arrives when
    its last one finishes (or ends when it no longer fits the pool). Checks the KV contents after
    every step."""
    contents, ids, num_requests = KVContents(kv.block_size), iter(range(1000, 10**6)), iter(range(10**6))
    history = [[] for _ in chats]
    pending = [list(chat) for chat in chats]
    capacity = kv.num_usable_blocks * kv.block_size  # a request alone must be able to finish

    def next_turn(c: int) -> None:
        while pending[c]:
            new_tokens, output = pending[c].pop(0)
            tokens = history[c] + new_tokens
            rid = next(num_requests)
            group = SequenceGroup(rid, [Sequence(rid, len(tokens), max_len=min(len(tokens) + output, capacity), seq_id=next(ids), token_ids=tokens)],
                                  SamplingParams())
            if kv.fits_ever(group):
                group.chat = c
                scheduler.add(group)
                return

    for c in range(len(chats)):
        next_turn(c)
    steps = 0
    while scheduler.has_unfinished():
        ready = {s.seq_id for s in contents.step(scheduler)}
        check_kv_contents(kv, scheduler, contents)
        for group in list(scheduler.running):
            seq = group.seqs[0]
            if seq.seq_id in ready:
                seq.append_token(rng.randrange(vocab))
            if seq.num_tokens >= seq.max_len:
                scheduler.finish(group, "length")
                history[group.chat] = list(seq.token_ids)
                next_turn(group.chat)
        steps += 1
        assert steps < 2_000, "the scheduler stopped making progress"
    assert kv.allocator.num_free == kv.num_blocks, "blocks leaked"
    return contents


@pytest.mark.parametrize("cache", ["hash", "radix"])
def test_a_cpu_hit_is_pinned_before_its_load_back_takes_a_gpu_block(cache):
    """Blocks of 2 tokens, a pool of 3, a tier of 1, one request at a time. A caches [1, 2] [3, 4];
    B's prompt evicts [3, 4] into the tier and caches [7, 8] [9, 10]; A's prompt again hits [1, 2]
    on the GPU and [3, 4] in the tier. The GPU block its load back takes evicts [9, 10] into the
    full tier, which must drop nothing that is about to be loaded. Unpinned, the tier dropped
    [3, 4] itself and reused its CPU block: the request read [9, 10]'s KV under its own tokens,
    and the prefix cache kept it."""
    kv = PagedBlockManager(3, 2, enable_caching=True, prefix_cache=cache, kv_offload_blocks=1, watermark=0)
    chats = [[([1, 2, 3, 4, 5], 1)], [([7, 8, 9, 10], 1)], [([1, 2, 3, 4, 5], 1)]]
    contents = run_conversations(kv, Scheduler(kv, 1, 100), chats, random.Random(0))
    assert len(contents.loads) == 1, "the third request's second block came back from the CPU tier"
    assert kv.offload.num_dropped == 0, "the tier dropped a block while its only block was pinned"


@settings(max_examples=150, deadline=None)
@given(
    chats=st.lists(st.lists(st.tuples(st.lists(st.integers(0, 1), min_size=1, max_size=8), st.integers(1, 6)), min_size=1, max_size=4),
                   min_size=2, max_size=3),
    block_size=st.sampled_from([1, 2, 4]),
    num_blocks=st.integers(3, 8),
    offload=st.integers(1, 3),
    num_cpu_blocks=st.sampled_from([0, 0, 8]),
    max_num_seqs=st.integers(1, 3),
    chunked=st.booleans(),
    cache=st.sampled_from(["hash", "radix"]),
    seed=st.integers(0, 1000),
)
def test_every_block_holds_the_kv_its_table_and_its_hash_name_with_a_small_cpu_tier(chats, block_size, num_blocks, offload,
                                                                                    num_cpu_blocks, max_num_seqs, chunked, cache, seed):
    kv = PagedBlockManager(num_blocks, block_size, enable_caching=True, prefix_cache=cache, kv_offload_blocks=offload,
                           num_cpu_blocks=num_cpu_blocks, watermark=0, shuffle_seed=seed)
    scheduler = Scheduler(kv, max_num_seqs, max(6, max_num_seqs * 3) if chunked else 10_000, enable_chunked_prefill=chunked,
                          preemption_mode="swap" if num_cpu_blocks else "recompute")
    run_conversations(kv, scheduler, chats, random.Random(seed), vocab=2)


def test_the_lpm_preset_shows_whom_longest_prefix_match_passed_over_and_why(tiny_llama_dir):
    """The "Longest prefix match" preset on a tiny model (the scheduling depends on token ids, not on the
    weights): once the first question has run, the questions that share its system prompt go before the long
    prompt that came earlier; each step that passes it over names who went first and how many of their tokens
    were cached, in the report, the timeline's wait reason and the step's caption, in English and 中文."""
    from engine.report import WAIT_LPM_PASSED_OVER
    from engine.timeline import WAITING, build_timeline
    from visualize.i18n import t
    from visualize.timeline import span_texts

    settings = preset_settings("preset_lpm")
    assert (settings["prefix_cache"], settings["scheduling_policy"], settings["max_batch"]) == ("radix", "lpm", 1)
    llm = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=settings["num_blocks"], max_num_seqs=1,
                                 enable_prefix_caching=True, prefix_cache="radix", scheduling_policy="lpm"))
    add_workload(llm, [(p, 2) for p, _ in PRESETS["preset_lpm"]["rows"]], temperature=0.0, seed=0)
    reports = []
    while llm.has_unfinished_requests():
        reports.append(llm.step())
    order = [rid for r in reports for rid, _, _ in r.admissions or ()]
    assert order == [0, 2, 3, 1], "the long prompt (request 1) came second and goes last"
    passed = [(r.passed_over, r.admissions[0]) for r in reports if r.passed_over]
    assert [p for p, _ in passed] == [{1: 2}, {1: 3}]
    assert all(hit > 0 and r.waiting[1] == WAIT_LPM_PASSED_OVER for r in reports if r.passed_over for _, _, hit in r.admissions)
    by, hit = 2, passed[0][1][2]
    spans = [s for row in build_timeline(reports) if row.request_id == 1 for s in row.spans
             if s.state == WAITING and s.reason == WAIT_LPM_PASSED_OVER]
    assert [s.blocker for s in spans] == [2, 3] and spans[0].blocker_cached == hit
    assert span_texts(spans[0], "en")[1] == f"passed over by request {by} (longest prefix match): {hit} of its tokens cached"
    assert span_texts(spans[0], "zh")[1] == f"被请求 {by} 越过（最长前缀匹配）：它有 {hit} 个 token 已缓存"
    assert t("admission_passed_over", "zh", rid=1, by=by, hit=hit) == f"请求 1 被越过：请求 {by} 先被接纳，它有 {hit} 个 token 已缓存"


def test_an_evicted_subtree_is_drawn_with_its_shape_parent_above_children():
    """Eviction cuts a path back leaf first: the evicted leaves are drawn under their evicted parent,
    one level deeper, after it, not beside it at its depth."""
    import re

    from engine.report import RadixNodeView, RadixTreeView
    from visualize.radix import radix_tree_html

    def node(node_id, parent_id, text):
        return RadixNodeView(node_id, parent_id, [1, 2], text, [node_id], 0, 1)

    tree = RadixTreeView(nodes=[node(1, 0, "system prompt")],
                         evicted=[node(3, 2, ". Question: What is a token?"), node(4, 2, ". Question: What is attention?"),
                                  node(2, 1, "words, define any technical term")])
    page = radix_tree_html(tree, "en")
    drawn = re.findall(r'data-node-id="(\d+)" .*?margin:3px 0 3px (\d+)px', page)
    order, margin = [int(i) for i, _ in drawn], {int(i): int(m) for i, m in drawn}
    assert order[:2] == [1, 2] and set(order[2:]) == {3, 4}, order
    assert margin[1] < margin[2] < margin[3] == margin[4]


def test_a_recomputed_requests_cache_hit_counts_the_tokens_its_re_prefill_covers(tiny_llama_dir):
    """After a recompute preemption a request prefills its prompt and its output so far: the prefix it finds
    cached is counted against those tokens (it was "37 of 37 prompt tokens"), and the label says so."""
    from visualize.radix import prefix_match_html

    llm = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=14, enable_prefix_caching=True))
    add_workload(llm, [(p, 40) for p, _ in PRESETS["preset_preemption"]["rows"][:4]], temperature=0.0, seed=0)
    prompt_len = {rid: group.num_prompt_tokens for rid, group in llm.requests.items()}
    found = []
    while llm.has_unfinished_requests() and not found:
        report = llm.step()
        found = [(rid, m) for rid, m in report.prefix_matches.items() if m.recompute]
    (rid, match), *_ = found
    assert prompt_len[rid] < match.num_prompt_tokens and match.num_cached_tokens < match.num_prompt_tokens
    assert f"{match.num_cached_tokens} of the {match.num_prompt_tokens} tokens it recomputes" in prefix_match_html(match, "en")
    assert f"重计算的 {match.num_prompt_tokens} 个 token" in prefix_match_html(match, "zh")
