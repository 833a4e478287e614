"""Invariants of the paged block allocator under random workloads (hypothesis drives the real scheduler).

- every block is free or referenced, never both;
- a block's refcount equals the number of block tables holding it;
- a request takes a new block only when its last block is full;
- a slot mapping never points outside the request's own blocks;
- no block leaks once every request has finished.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.block_pool import BlockAllocator, NoFreeBlocksError
from engine.core.block_manager import PagedBlockManager
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence, SequenceStatus


def check_invariants(kv: PagedBlockManager, scheduler: Scheduler) -> None:
    alloc = kv.allocator
    free = set(alloc.free_blocks)
    assert len(free) == len(alloc.free_blocks), "a block is on the free list twice"
    held = Counter(b for seq in scheduler.running for b in seq.block_table)
    for block in range(kv.num_blocks):
        assert (block in free) != (alloc.ref_counts[block] > 0), f"block {block} both free and referenced, or neither"
        assert alloc.ref_counts[block] == held[block], f"block {block}: refcount {alloc.ref_counts[block]}, held by {held[block]} tables"
    for seq in scheduler.running:
        # Room for every token the next step computes, and not one block more.
        assert len(seq.block_table) == kv.blocks_needed(seq.num_tokens) or len(seq.block_table) == kv.blocks_needed(seq.num_computed_tokens)
        own = {b * kv.block_size + o for b in seq.block_table for o in range(kv.block_size)}
        assert set(kv.slot_mapping(seq, 0, seq.num_computed_tokens)) <= own
    for seq in scheduler.waiting:
        assert not seq.block_table, "a waiting request holds blocks"


def run_model_free_step(scheduler: Scheduler) -> None:
    """One step as the engine does it, without a model: compute the scheduled tokens, emit one more."""
    batch = scheduler.schedule()
    for seq in batch.prefill_seqs + batch.decode_seqs:
        seq.num_computed_tokens = seq.num_tokens
        seq.append_token()
        if seq.num_tokens >= seq.max_len:
            scheduler.finish(seq, "length")


requests = st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    requests=requests,
    block_size=st.sampled_from([1, 2, 3, 4, 8, 16]),
    num_blocks=st.integers(1, 40),
    max_num_seqs=st.integers(1, 6),
    aborts=st.lists(st.integers(0, 11), max_size=4),
    shuffle=st.booleans(),
    watermark=st.sampled_from([0.0, 0.01, 0.2, 0.5]),
)
def test_allocator_invariants_hold_under_random_workloads(requests, block_size, num_blocks, max_num_seqs, aborts, shuffle, watermark):
    kv = PagedBlockManager(num_blocks, block_size, shuffle_seed=1 if shuffle else None, watermark=watermark)
    scheduler = Scheduler(kv, max_num_seqs, max_num_batched_tokens=10_000)
    capacity = num_blocks * block_size
    seqs = []
    for i, (prompt, output) in enumerate(requests):
        seq = Sequence(i, prompt, max_len=min(prompt + output, capacity))
        if prompt + 1 > capacity or not kv.fits_ever(seq):
            continue  # the engine rejects these in add_request
        seqs.append(seq)
        scheduler.add(seq)
    steps = 0
    while scheduler.has_unfinished():
        run_model_free_step(scheduler)
        check_invariants(kv, scheduler)
        if steps in aborts and scheduler.running:
            scheduler.finish(scheduler.running[-1], "abort")
            check_invariants(kv, scheduler)
        steps += 1
        assert steps < 10_000, "the scheduler stopped making progress"
    assert kv.allocator.num_free == num_blocks, "blocks leaked"
    assert all(s.finish_reason in ("length", "abort") for s in seqs)


def test_new_block_only_when_the_last_block_is_full():
    kv = PagedBlockManager(num_blocks=8, block_size=4)
    seq = Sequence(0, num_prompt_tokens=5, max_len=100)
    kv.allocate(seq)
    assert len(seq.block_table) == 2
    for num_tokens, blocks in [(6, 2), (7, 2), (8, 2), (9, 3), (12, 3), (13, 4)]:
        seq.num_tokens = num_tokens
        kv.append_slot(seq)
        assert len(seq.block_table) == blocks, f"at {num_tokens} tokens"


def test_refcounts_follow_sharing_and_freeing():
    alloc = BlockAllocator(2)
    a = alloc.allocate()
    alloc.incref(a)
    assert alloc.free(a) is False and alloc.ref_counts[a] == 1
    assert alloc.free(a) is True and a in alloc.free_blocks
    alloc.allocate(), alloc.allocate()
    with pytest.raises(NoFreeBlocksError):
        alloc.allocate()


def test_watermark_keeps_blocks_free_at_admission():
    """vLLM's rule (v0 BlockSpaceManagerV1.can_allocate): admit only if free - needed >= watermark
    blocks, int(watermark * num_blocks). 100 blocks of 4 slots, watermark 0.05 -> 5 blocks."""
    kv = PagedBlockManager(num_blocks=100, block_size=4, watermark=0.05)
    assert kv.watermark_blocks == 5
    running = Sequence(0, num_prompt_tokens=4 * 50, max_len=400)  # 50 blocks
    kv.allocate(running)
    assert kv.can_allocate(Sequence(1, num_prompt_tokens=4 * 45, max_len=400))  # 50 - 45 = 5 left
    assert not kv.can_allocate(Sequence(2, num_prompt_tokens=4 * 45 + 1, max_len=400))  # 46 blocks: 4 left
    kv_off = PagedBlockManager(num_blocks=100, block_size=4, watermark=0.0)
    kv_off.allocate(Sequence(0, num_prompt_tokens=4 * 50, max_len=400))
    assert kv_off.can_allocate(Sequence(2, num_prompt_tokens=4 * 50, max_len=400))  # without it: all 50


def test_watermark_never_keeps_out_a_request_that_fits_the_empty_pool():
    """With nothing running, a request that fits is admitted even if it leaves less than the
    watermark (vLLM would reject it as never schedulable); the scheduler runs it to the end."""
    kv = PagedBlockManager(num_blocks=10, block_size=4, watermark=0.5)
    assert kv.watermark_blocks == 5
    big = Sequence(0, num_prompt_tokens=4 * 9, max_len=4 * 10)  # 9 blocks, 10 at the end
    assert kv.can_allocate(big)
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=1000)
    scheduler.add(big)
    small = Sequence(1, num_prompt_tokens=1, max_len=2)
    scheduler.add(small)
    assert scheduler.schedule().prefill_seqs == [big]  # small waits: 1 free block < 1 + 5
    big.num_computed_tokens = big.num_tokens
    big.append_token()
    while big.status is not SequenceStatus.FINISHED:
        run_model_free_step(scheduler)
        assert small.status is SequenceStatus.WAITING
    assert kv.can_allocate(small) and scheduler.schedule().prefill_seqs == [small]


@pytest.mark.parametrize("watermark", [-0.1, 1.0])
def test_watermark_outside_0_1_is_a_value_error(watermark):
    with pytest.raises(ValueError, match="watermark"):
        PagedBlockManager(num_blocks=10, block_size=4, watermark=watermark)
