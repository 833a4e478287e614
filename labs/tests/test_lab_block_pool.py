"""Lab block_pool: the free queue and the reference counts (engine/core/block_pool.py)."""

import pytest

from engine.core.block_pool import BlockAllocator, FreeBlockQueue, NoFreeBlocksError


def test_free_queue_order():
    q = FreeBlockQueue([3, 1, 2])
    assert q.popleft() == 3, "popleft must take the head of the queue (the first id given)"
    q.append(3)
    assert list(q) == [1, 2, 3], "append must put a block at the tail"
    q.remove(2)
    assert list(q) == [1, 3], "remove must take a block out of the middle, keeping the others' order"
    with pytest.raises(AssertionError):
        q.append(1)  # free already


def test_allocate_takes_the_head_with_refcount_one():
    a = BlockAllocator(4)
    assert [a.allocate() for _ in range(4)] == [0, 1, 2, 3], "allocate hands blocks out from the head of the free queue"
    assert a.ref_counts == [1, 1, 1, 1], "an allocated block has refcount 1"
    assert a.num_free == 0
    with pytest.raises(NoFreeBlocksError):
        a.allocate()


def test_free_returns_blocks_to_the_tail_least_recently_freed_first():
    a = BlockAllocator(4)
    blocks = [a.allocate() for _ in range(3)]
    assert a.free(blocks[1]) is True, "free returns True when the block goes back to the free queue"
    assert a.free(blocks[0]) is True
    assert list(a.free_blocks) == [3, 1, 0], "freed blocks go to the tail, in the order they were freed"
    assert a.allocate() == 3, "the block free the longest is handed out first (LRU)"
    with pytest.raises(AssertionError):
        a.free(blocks[0])  # freed twice


def test_a_shared_block_is_freed_by_its_last_holder():
    a = BlockAllocator(2)
    b = a.allocate()
    a.incref(b)
    assert a.ref_counts[b] == 2 and b in a.shared, "incref adds a reference and records the block in `shared`"
    assert a.free(b) is False, "a block still referenced stays out of the free queue (free returns False)"
    assert a.ref_counts[b] == 1 and b not in a.shared and b not in a.free_blocks
    assert a.free(b) is True and a.ref_counts[b] == 0 and list(a.free_blocks)[-1] == b
    with pytest.raises(AssertionError):
        a.incref(b)  # a free block cannot be shared


def test_touch_takes_a_free_cached_block_off_the_queue_and_free_puts_it_back():
    a = BlockAllocator(4)
    a.touch(2)
    assert a.ref_counts[2] == 1, "touching a free block gives it refcount 1"
    assert list(a.free_blocks) == [0, 1, 3], "touch takes a free block out of the middle of the queue"
    a.touch(2)
    assert a.ref_counts[2] == 2, "touching a referenced block adds a reference"
    assert 2 in a.shared, "a block touched to refcount 2 is shared: record it in `shared`"
    assert a.free(2) is False and a.free(2) is True, "two touches, two frees: the block must come back (no refcount leak)"
    assert list(a.free_blocks) == [0, 1, 3, 2] and a.ref_counts[2] == 0


def test_null_block_and_shuffle_are_kept_out_of_the_way():
    a = BlockAllocator(5, shuffle_seed=3, null_block=True)
    got = sorted(a.allocate() for _ in range(4))
    assert got == [1, 2, 3, 4], "block 0 (the null block) is never handed out"


def test_the_allocator_runs_the_radix_caches_free_queue():
    """Under SGLang's radix cache the engine hands the allocator another free queue (RadixFreeQueue): the parts
    must use the queue's interface (popleft, append, remove, len, in, iteration), never its private attributes."""
    from engine.core.radix_cache import RadixCache, RadixFreeQueue

    a = BlockAllocator(4)
    a.free_blocks = RadixFreeQueue(list(a.free_blocks), RadixCache(4, 4))
    blocks = [a.allocate() for _ in range(4)]
    assert sorted(blocks) == [0, 1, 2, 3] and a.num_free == 0
    with pytest.raises(NoFreeBlocksError):
        a.allocate()
    a.incref(blocks[0])
    assert a.free(blocks[0]) is False and a.free(blocks[0]) is True, "the last holder frees it"
    assert a.free(blocks[1]) is True and list(a.free_blocks) == [blocks[0], blocks[1]]
    a.touch(blocks[1])
    assert blocks[1] not in a.free_blocks and a.ref_counts[blocks[1]] == 1, "touch takes a free block off this queue too"
