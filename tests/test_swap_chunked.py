"""The scheduler's other choices: swap preemption (paper §4.5) and chunked prefill with a token budget.

- every block is in exactly one place: the GPU free queue, the CPU free queue, or the block tables
  of requests on the side where they live; the CPU pool never over-commits; nothing leaks;
- while any request is swapped out, nothing new is admitted, and swapped requests come back first;
- a swap out and back in restores every slot of the request bit for bit;
- no step computes more than max_num_batched_tokens; decodes are never starved by a long prompt;
- greedy outputs are the same under recompute, under swap, with chunked prefill at any chunk size,
  and with no memory pressure at all.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.model_executor.attention import swap_blocks
from engine.core.block_manager import PagedBlockManager
from engine.sim.cost_model import PicosecondCost, StepShape, get_setup
from engine.model_executor.model_loader import load_model
from engine.report import PREEMPT, RECOMPUTE_CPU_POOL_FULL, SWAP_IN, SWAP_OUT
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceGroup, SequenceStatus, fork_samples
from engine.experiments.swap import figure_19, format_figure_19
from tests.test_engine import random_prompts, run_engine, tiny_model, tiny_reference  # noqa: F401 (fixtures: the 3 tiny models; 5 prompts' greedy outputs)


# ---- the allocator and scheduler without a model ----------------------------------------------

def check_pools(kv: PagedBlockManager, scheduler: Scheduler) -> None:
    """Every block in exactly one place, refcount = number of tables holding it, on both sides."""
    for allocator, groups, side in ((kv.allocator, scheduler.running, "GPU"), (kv.cpu_allocator, scheduler.swapped, "CPU")):
        if allocator is None:
            continue
        held = Counter(b for g in groups for s in g.unfinished_seqs() for b in s.block_table)
        free = Counter(allocator.free_blocks)
        assert all(n == 1 for n in free.values()), f"a {side} block is on the free queue twice"
        for block in range(allocator.num_blocks):
            assert allocator.ref_counts[block] == held[block], f"{side} block {block}: refcount {allocator.ref_counts[block]}, {held[block]} tables"
            assert (block in free) == (held[block] == 0), f"{side} block {block}: free iff no table holds it"
        assert sum(1 for b in range(allocator.num_blocks) if held[b]) + len(free) == allocator.num_blocks, f"the {side} pool over-committed"
    for group in scheduler.waiting:
        assert all(not s.block_table for s in group.unfinished_seqs()), "a waiting request holds blocks"
    for group in scheduler.swapped:
        assert group.status is SequenceStatus.SWAPPED
        assert all(s.status is SequenceStatus.SWAPPED for s in group.unfinished_seqs())
    if kv.prefix_cache is not None:  # a block is hashed only once every one of its slots is written
        for group in scheduler.running:
            for seq in group.unfinished_seqs():
                for i, block in enumerate(seq.block_table):
                    if kv.prefix_cache.block_hash[block] is not None:
                        assert (i + 1) * kv.block_size <= seq.num_computed_tokens, f"block {block} hashed before it was full"


def model_free_step(scheduler: Scheduler, next_seq_id) -> tuple:
    """One engine step without a model: the scheduled tokens are computed, a finished prefill of a
    group forks its samples, every sequence whose tokens are all computed gains one token, and a
    request at its length finishes."""
    waiting_before = list(scheduler.waiting)
    swapped_before = bool(scheduler.swapped)
    batch = scheduler.schedule()
    ready = scheduler.update_from_output(batch)
    ready_ids = {s.seq_id for s in ready}
    for group in list(scheduler.running):
        first = group.seqs[0]
        if first.seq_id in ready_ids:  # after the prompt's one prefill
            ready_ids.update(child.seq_id for child in fork_samples(group, scheduler.fork, next_seq_id))
        for seq in group.unfinished_seqs():
            if seq.seq_id in ready_ids:
                seq.append_token()
        if all(s.num_tokens >= s.max_len for s in group.unfinished_seqs()):
            scheduler.finish(group, "length")
    admitted = [g for g in waiting_before if g.status is not SequenceStatus.WAITING and g not in batch.preempted]
    return batch, admitted, swapped_before


@settings(max_examples=120, deadline=None)
# A group re-prefilling alone overdraws the budget; the next prompt must not get a negative chunk.
@example(requests=[(4, 4, 1), (2, 4, 2), (5, 1, 1)], block_size=4, num_blocks=5, num_cpu_blocks=1, max_num_seqs=2, chunked=True,
         budget=5, caching=True, seed=0)
@given(
    requests=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 60), st.integers(1, 3)), min_size=2, max_size=8),
    block_size=st.sampled_from([1, 2, 4, 16]),
    num_blocks=st.integers(4, 30),
    num_cpu_blocks=st.integers(1, 40),
    max_num_seqs=st.integers(1, 5),
    chunked=st.booleans(),
    budget=st.integers(5, 64),
    caching=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_swap_and_chunked_prefill_keep_every_block_in_one_place(requests, block_size, num_blocks, num_cpu_blocks, max_num_seqs,
                                                                chunked, budget, caching, seed):
    rng = random.Random(seed)
    kv = PagedBlockManager(num_blocks, block_size, shuffle_seed=seed, num_cpu_blocks=num_cpu_blocks, enable_caching=caching)
    budget = max(budget, max_num_seqs * 3) if chunked else 10_000
    scheduler = Scheduler(kv, max_num_seqs, budget, preemption_mode="swap", enable_chunked_prefill=chunked)
    ids = iter(range(1000, 10**6))
    shared = [rng.randrange(100) for _ in range(24)]  # a common prefix, so that prefix caching hits
    for i, (prompt, output, n) in enumerate(requests):
        tokens = (shared + [rng.randrange(100, 10**4) for _ in range(prompt)])[:prompt]
        seq = Sequence(i, prompt, max_len=min(prompt + output, num_blocks * block_size), seq_id=next(ids), token_ids=tokens)
        group = SequenceGroup(i, [seq], SamplingParams(n=n))
        if prompt + 1 <= seq.max_len and kv.fits_ever(group):
            scheduler.add(group)
    steps = 0
    while scheduler.has_unfinished():
        batch, admitted, swapped_before = model_free_step(scheduler, lambda: next(ids))
        check_pools(kv, scheduler)
        computed = sum(batch.num_scheduled_tokens.get(s.seq_id, 0) for s in batch.prefill_seqs) + len(batch.decode_seqs)
        if chunked:
            assert computed <= budget, f"a step computed {computed} tokens over the budget of {budget}"
        if swapped_before:
            assert not admitted, "a new request was admitted while another was swapped out"
        steps += 1
        assert steps < 5_000, "the scheduler stopped making progress"
    assert kv.allocator.num_free == num_blocks, "GPU blocks leaked"
    assert kv.cpu_allocator.num_free == num_cpu_blocks, "CPU blocks leaked"


def pressure(num_cpu_blocks: int, mode: str = "swap"):
    """Three requests of 4 + 12 tokens in 8 blocks of 4: the third must give way."""
    kv = PagedBlockManager(num_blocks=8, block_size=4, num_cpu_blocks=num_cpu_blocks)
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=1000, preemption_mode=mode)
    for i in range(3):
        scheduler.add(Sequence(i, 4, max_len=16, seq_id=i))
    return kv, scheduler


def test_a_swapped_request_comes_back_before_any_waiting_one_and_decodes_on():
    kv, scheduler = pressure(num_cpu_blocks=8)
    late = Sequence(9, 2, max_len=4, seq_id=9)
    ids = iter(range(100, 1000))
    swapped_out = []
    for _ in range(100):
        batch, admitted, swapped_before = model_free_step(scheduler, lambda: next(ids))
        if batch.swapped_out:
            swapped_out = batch.swapped_out
            assert batch.blocks_to_swap_out and all(kv.cpu_allocator.ref_counts[c] == 1 for _, c in batch.blocks_to_swap_out)
            scheduler.add(late)  # arrives while a request is swapped out
        if batch.swapped_in:
            assert batch.swapped_in == swapped_out and late.status is SequenceStatus.WAITING, "swapped requests come back first"
            seq = batch.swapped_in[0]
            assert seq.num_computed_tokens == seq.num_tokens - 1 and seq in batch.decode_seqs, "it decodes on, nothing recomputed"
            break
        check_pools(kv, scheduler)
    else:
        pytest.fail("no request was swapped out and back in")
    kinds = [e.kind for e in kv.events]
    assert SWAP_OUT in kinds and SWAP_IN in kinds and any(e.kind == PREEMPT and e.detail == "swap" for e in kv.events)


def test_a_full_cpu_pool_falls_back_to_recompute_and_says_so():
    kv, scheduler = pressure(num_cpu_blocks=1)  # a victim holds 2+ blocks: no room to swap it
    ids = iter(range(100, 1000))
    while scheduler.has_unfinished():
        batch, _, _ = model_free_step(scheduler, lambda: next(ids))
        check_pools(kv, scheduler)
    assert scheduler.num_swap_fallbacks > 0
    details = [e.detail for e in kv.events if e.kind == PREEMPT]
    assert RECOMPUTE_CPU_POOL_FULL in details


def test_a_group_shares_its_blocks_on_the_cpu_side_too():
    """Blocks shared within a group are copied once (paper §4.5: the group is swapped as a unit)."""
    kv = PagedBlockManager(num_blocks=16, block_size=4, num_cpu_blocks=16)
    parent = Sequence(0, num_prompt_tokens=10, max_len=30, token_ids=list(range(10)))
    group = SequenceGroup(0, [parent], SamplingParams(n=3))
    kv.allocate(group)
    parent.num_computed_tokens = 10
    group.seqs += [parent.fork(i, i) for i in (1, 2)]
    for child in group.seqs[1:]:
        kv.fork(parent, child)
    pairs = kv.swap_out(group)
    assert len(pairs) == 3, "3 shared blocks, copied once each"
    assert all(kv.cpu_allocator.ref_counts[c] == 3 for _, c in pairs) and kv.allocator.num_free == 16
    back = kv.swap_in(group)
    assert len(back) == 3 and all(kv.allocator.ref_counts[g] == 3 for _, g in back) and kv.cpu_allocator.num_free == 16
    assert [s.block_table for s in group.seqs] == [[g for _, g in back]] * 3


# ---- chunked prefill and the budget ---------------------------------------------------------

def test_decodes_are_never_starved_by_a_long_prompt_and_the_prompt_completes():
    kv = PagedBlockManager(num_blocks=64, block_size=4)
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=8, enable_chunked_prefill=True)
    short = [Sequence(i, 3, max_len=40, seq_id=i) for i in range(2)]
    for seq in short:
        scheduler.add(seq)
    ids = iter(range(100, 1000))
    model_free_step(scheduler, lambda: next(ids))
    long = Sequence(5, 50, max_len=52, seq_id=5)  # longer than the budget
    scheduler.add(long)
    chunks = []
    while long.is_prefill:
        batch, _, _ = model_free_step(scheduler, lambda: next(ids))
        assert [s.seq_id for s in batch.decode_seqs] == [0, 1], "the running decodes go first, every step"
        chunks.append(batch.num_scheduled_tokens[long.seq_id])
        assert sum(chunks) == long.num_computed_tokens or not long.is_prefill
    assert chunks == [6] * 8 + [2] and long.num_tokens == 51, "6 of 8 tokens per step after the 2 decodes"


@pytest.mark.parametrize("budget, chunks", [(8, [8, 8, 4]), (9, [9, 9, 2])])
def test_a_chunk_can_end_on_a_block_boundary_or_one_token_after(budget, chunks):
    kv = PagedBlockManager(num_blocks=16, block_size=8)
    scheduler = Scheduler(kv, max_num_seqs=1, max_num_batched_tokens=budget, enable_chunked_prefill=True)
    seq = Sequence(0, 20, max_len=22, seq_id=0)
    scheduler.add(seq)
    seen = []
    while seq.is_prefill:
        batch = scheduler.schedule()
        seen.append(batch.num_scheduled_tokens[0])
        assert len(seq.block_table) == -(-(seq.num_computed_tokens + seen[-1]) // 8), "blocks only for the chunk's tokens"
        scheduler.update_from_output(batch)
    assert seen == chunks


# ---- swap_blocks: the copy itself --------------------------------------------------------------

def test_swap_blocks_round_trip_restores_every_slot_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    gpu = [torch.randn(10, 4, 2, 8, generator=g) for _ in range(4)]  # 2 layers x (K, V)
    before = [c.clone() for c in gpu]
    cpu = [torch.zeros(6, 4, 2, 8) for _ in range(4)]
    swap_blocks(gpu, cpu, torch.tensor([[3, 0], [7, 5], [1, 2]]))
    for c in gpu:
        c[[3, 7, 1]] = float("nan")  # the freed blocks are reused by others
    swap_blocks(cpu, gpu, torch.tensor([[0, 4], [5, 9], [2, 0]]))
    for b, a in zip(before, gpu):
        for old, new in ((3, 4), (7, 9), (1, 0)):
            assert torch.equal(b[old], a[new])
    with pytest.raises(ValueError, match="different layouts"):
        swap_blocks(gpu, [torch.zeros(6, 8, 2, 8)] * 4, torch.tensor([[0, 0]]))


# ---- the engine on a real (tiny) model -------------------------------------------------------

def test_outputs_survive_swap_preemption(tiny_llama_dir, tiny_reference):
    prompts, params, expected = tiny_reference
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float64", block_size=4, num_gpu_blocks=24,
                                    preemption_mode="swap"))
    outputs, reports = run_engine(engine, prompts, params)
    assert outputs == expected
    out = [r for r in reports if r.swapped_out]
    back = [r for r in reports if r.swapped_in]
    assert out and back, "the pool was meant to run out and swap"
    report = out[0]
    assert report.blocks_to_swap_out and report.swapped and report.cpu_memory.token_states > 0
    assert {t.request_id for t in report.cpu_block_tables} == set(report.swapped)
    assert all(e.detail == "swap" for r in reports for e in r.events if e.kind == PREEMPT)
    assert report.timings_ms["swap"] >= 0
    assert engine.kv.cpu_allocator.num_free == engine.num_cpu_blocks and engine.memory_usage().free == 96


def test_a_swapped_request_is_restored_bit_for_bit(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=12, preemption_mode="swap"))
    for prompt in random_prompts(49152, [6, 6, 6], seed=2):
        engine.add_request(prompt, SamplingParams(max_tokens=24, ignore_eos=True))

    def cached_slots(seq):  # every layer's K and V of the tokens the request has in the cache
        return [(k[seq.block_table].flatten(0, 1)[: seq.num_computed_tokens].clone(), v[seq.block_table].flatten(0, 1)[: seq.num_computed_tokens].clone())
                for k, v in engine.runner.kv_caches]

    swapped_kv = {}
    while engine.has_unfinished_requests():
        before = {g.request_id: cached_slots(g.seqs[0]) for g in engine.scheduler.running}
        report = engine.step()
        for rid in report.swapped_out:
            swapped_kv[rid] = before[rid]
        for rid in report.swapped_in:
            seq = engine.requests[rid].seqs[0]
            after = [(k[seq.block_table].flatten(0, 1), v[seq.block_table].flatten(0, 1)) for k, v in engine.runner.kv_caches]
            for (k0, v0), (k, v) in zip(swapped_kv[rid], after):
                assert torch.equal(k0, k[: len(k0)]) and torch.equal(v0, v[: len(v0)]), "a slot changed on its way to the CPU and back"
            return
    pytest.fail("no request was swapped out and back in")


@pytest.mark.parametrize("budget", [1, 7, 8, 9, 16])  # block 8: chunks ending on a block boundary (8, 16) and one token after it (9)
def test_outputs_do_not_change_with_chunked_prefill(tiny_llama_dir, tiny_reference, budget):
    prompts, params, expected = tiny_reference
    config = EngineConfig(model=str(tiny_llama_dir), dtype="float64", block_size=8, num_gpu_blocks=64, enable_chunked_prefill=True,
                          max_num_batched_tokens=budget, max_num_seqs=min(budget, 4))
    engine = LLMEngine(config)
    outputs, reports = run_engine(engine, prompts, params)
    assert outputs == expected
    assert max(r.num_tokens for r in reports) <= budget
    chunked = [s for r in reports for s in r.scheduled if s.phase == "prefill" and s.num_computed_tokens < s.num_prefill_tokens]
    assert chunked, "some prompt was meant to span several steps"


@pytest.mark.parametrize("mode, chunked", [("recompute", False), ("swap", False), ("recompute", True), ("swap", True)])
def test_every_tiny_model_gives_the_same_outputs_under_pressure(tiny_model, mode, chunked):
    directory, hf = tiny_model
    prompts = random_prompts(hf.config.vocab_size, [5, 17, 33, 2])
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    calm_engine = LLMEngine(EngineConfig(model=str(directory), dtype="float64", num_gpu_blocks=64))
    calm, _ = run_engine(calm_engine, prompts, params)
    # A hybrid model (tiny Gemma 3: a sliding-window layer, window 8, and a full one) keeps a table per KV cache
    # group in one pool, and a null block. Without chunked prefill a recomputed request prefills all its tokens at
    # once, so one request of 33 + 16 tokens needs 13 blocks in each group (27 with the null block): a smaller pool
    # caps max_model_len below 49 and the request would end early with "length", as vLLM's would. 31 blocks hold
    # that one request and leave the four short; the sliding group frees blocks as they decode, and swapped
    # tables fill the CPU swap space up to its last block (the swap space keeps a null block of its own too).
    num_blocks = 31 if calm_engine.kv_cache_config is not None else 14
    config = EngineConfig(model=str(directory), dtype="float64", block_size=4, num_gpu_blocks=num_blocks, max_num_seqs=4, preemption_mode=mode,
                          enable_chunked_prefill=chunked, max_num_batched_tokens=7 if chunked else None)
    outputs, reports = run_engine(LLMEngine(config), prompts, params)
    assert outputs == calm
    assert any(r.preempted for r in reports), "the pool holds fewer tokens than the four requests: someone must be preempted"


def test_chunked_prefill_with_prefix_caching_hashes_only_written_blocks(tiny_llama_dir):
    """inference-sim #196's case: 200 tokens, chunks of 100-200, blocks of 16."""
    prompt = random_prompts(49152, [200], seed=9)[0]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    plain = LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float64", num_gpu_blocks=64, enable_prefix_caching=False))
    expected, _ = run_engine(plain, [prompt], params)
    for budget in (100, 150, 200):
        engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), dtype="float64", num_gpu_blocks=64, enable_chunked_prefill=True,
                                        max_num_batched_tokens=budget))
        first, _ = run_engine(engine, [prompt], params)
        again, _ = run_engine(engine, [prompt], params)
        assert first == again == expected
        assert engine.get_output(1).num_cached_tokens == 192, "12 full blocks of 16 found cached"


def test_swap_and_chunked_prefill_together_on_the_default_model(default_model_dir):
    prompts = [[{"role": "user", "content": q}] for q in ("What is a KV cache?", "Name three planets.", "Why is the sea salty?")]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    loaded = load_model(None, dtype=torch.float32)
    calm = LLMEngine(EngineConfig(num_gpu_blocks=64), loaded_model=loaded)
    expected, _ = run_engine(calm, prompts, params)
    squeezed = LLMEngine(EngineConfig(block_size=8, num_gpu_blocks=16, preemption_mode="swap", enable_chunked_prefill=True,
                                      max_num_batched_tokens=16, max_num_seqs=3), loaded_model=loaded)
    outputs, reports = run_engine(squeezed, prompts, params)
    assert outputs == expected
    assert any(r.swapped_out for r in reports) and max(r.num_tokens for r in reports) <= 16


# ---- bad settings ------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(swap_space=-1, preemption_mode="swap"), "swap_space must be a number of bytes >= 0"),
    (dict(preemption_mode="swapping"), "preemption_mode must be one of recompute, swap"),
    (dict(max_num_batched_tokens=4, max_num_seqs=8, enable_chunked_prefill=True), r"max_num_batched_tokens \(4\) must be >= max_num_seqs \(8\)"),
    (dict(allocator="contiguous", preemption_mode="swap", enable_prefix_caching=False), "preemption_mode='swap' needs allocator='paged'"),
    (dict(preemption_mode="swap", swap_space=0), "nowhere to swap to"),
])
def test_bad_swap_and_budget_settings_are_refused_clearly(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs)


def test_a_swap_space_smaller_than_one_block_is_refused(tiny_llama_dir):
    with pytest.raises(ValueError, match="swap_space=10 bytes is smaller than one block"):
        LLMEngine(EngineConfig(model=str(tiny_llama_dir), preemption_mode="swap", swap_space=10))


# ---- vLLM #588 / #787: many samples and long outputs with a small swap space ------------------

def test_fifty_samples_of_600_tokens_fall_back_to_recompute_instead_of_crashing():
    """vLLM crashed when a group could not be swapped out (n = 50, max_tokens = 600); here the
    scheduler recomputes it, says so, and every request still finishes."""
    kv = PagedBlockManager(num_blocks=2000, block_size=16, num_cpu_blocks=100)
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=100_000, preemption_mode="swap")
    ids = iter(range(1000, 10**6))
    for i in range(2):
        group = SequenceGroup(i, [Sequence(i, 20, max_len=620, seq_id=next(ids))], SamplingParams(n=50), arrival_time=float(i))
        assert kv.fits_ever(group)
        scheduler.add(group)
    steps = 0
    while scheduler.has_unfinished():
        model_free_step(scheduler, lambda: next(ids))
        steps += 1
        assert steps < 10_000
    assert scheduler.num_swap_fallbacks > 0, "two groups of 50 x 620 tokens cannot both fit 2000 blocks, nor 100 CPU blocks"
    assert kv.allocator.num_free == 2000 and kv.cpu_allocator.num_free == 100


# ---- vLLM's null block, as an option -----------------------------------------------------------

def test_the_null_block_is_never_handed_out_and_not_counted(tiny_llama_dir):
    engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), block_size=4, num_gpu_blocks=10, reserve_null_block=True))
    assert engine.max_model_len == 36, "9 usable blocks of 4"
    assert engine.memory_usage().capacity == 36
    outputs, reports = run_engine(engine, random_prompts(49152, [7, 9], seed=1), SamplingParams(max_tokens=12, ignore_eos=True))
    held = {b for r in reports for t in r.block_tables for b in t.block_table}
    assert 0 not in held and len(held) == 9, "block 0 stays out; the other 9 serve the requests (10 needed: a preemption)"
    assert engine.memory_usage().free == 36


# ---- Figure 19: the cost of a swap, and of a recompute ------------------------------------------

def test_a_swap_costs_one_fixed_copy_cost_per_block_plus_its_bytes_over_pcie():
    model = get_setup("a100-opt-13b-achieved").cost_model
    # OPT-13B: 40 layers x (K, V) copies of 5 us per block; 819,200 bytes per token at 24 GB/s.
    assert model.swap_copy_s == pytest.approx(80 * 5e-6)
    assert model.swap_token_s == pytest.approx(2 * 40 * 5120 * 2 / 24e9)
    assert model.swap_time(1, 16) == pytest.approx(400e-6 + 16 * 819_200 / 24e9)
    shape = StepShape(num_decodes=1, decode_context=100, swap_blocks=2, swap_slots=32)
    assert model.step_time(shape) - model.step_time(StepShape(num_decodes=1, decode_context=100)) == pytest.approx(model.swap_time(2, 32))
    assert PicosecondCost.of(model).step(shape) == pytest.approx(model.step_time(shape) * 1e12, rel=1e-6)


def test_figure_19_swap_is_dear_at_small_blocks_and_recompute_does_not_depend_on_them():
    result = figure_19(num_requests=150, request_rate=4.0, token_state_requests=200)
    a = {r["block_size"]: r for r in result["a"]}
    assert a[1]["swap_ms"] > 5 * a[256]["swap_ms"], "a block of one token is one copy per token"
    assert max(r["recompute_ms"] for r in result["a"]) < 1.05 * min(r["recompute_ms"] for r in result["a"])
    assert a[1]["swap_ms"] > a[1]["recompute_ms"] and a[256]["swap_ms"] < a[256]["recompute_ms"]
    swap = [r for r in result["b"] if r["mode"] == "swap"]
    recompute = [r for r in result["b"] if r["mode"] == "recompute"]
    assert all(r["blocks_swapped"] > 0 and r["tokens_recomputed"] == 0 for r in swap)
    assert all(r["blocks_swapped"] == 0 and r["tokens_recomputed"] > 0 for r in recompute)
    assert {r["policy"] for r in result["token_states"]} == {"recompute", "swap", "chunked prefill (recompute)", "chunked prefill + swap"}
    text = format_figure_19(result)
    assert "swap in+out" in text and "Token states while requests wait" in text


def test_figure_19_chart_draws_the_numbers_it_was_given():
    from visualize.swap_figure import plot_swap_vs_recompute

    result = {"tokens_per_preemption": 200, "request_rate": 2.0,
              "a": [{"block_size": b, "swap_ms": 100 / b, "recompute_ms": 30.0} for b in (1, 16, 256)],
              "b": [{"block_size": b, "mode": m, "normalized_latency_s": 0.4 + (m == "swap") * 0.01} for b in (8, 64) for m in ("recompute", "swap")]}
    fig = plot_swap_vs_recompute(result)
    a, b = fig.axes
    lines = {line.get_label(): list(line.get_ydata()) for line in a.lines}
    assert lines == {"swap in + out": [100.0, 6.25, 100 / 256], "recompute": [30.0] * 3}
    assert {line.get_label(): list(line.get_ydata()) for line in b.lines} == {"swap": pytest.approx([0.41] * 2), "recompute": [0.4, 0.4]}
    assert a.get_xlabel() == b.get_xlabel() == "block size (tokens)" and "200 tokens" in a.get_title()
