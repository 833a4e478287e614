"""Lab bug_refcount: Find the bug: the block pool / 找错误：块池.

A copy of the block pool with one bug seeded. Run the tests, read the failing hint, find and fix the
line.

块池的一个副本，其中埋了一个错误。运行测试、读失败时给出的线索，找到并修正那一行。

Your part plugs into the engine in place of its own, in engine/core/block_pool.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade bug_refcount --impl labs/mine

Cut by `python -m lessons labs build` from engine/core/block_pool.py; work on a copy.

The module engine/core/block_pool.py, for context:

The pool of physical KV blocks: a free queue and reference counts (vLLM v1's ``BlockPool`` and
``FreeKVCacheBlockQueue``; PagedAttention paper §4.2). Block ids are plain ints; the paged manager
(``engine/core/block_manager.py``) keeps the block tables.
"""

from __future__ import annotations
import random

LAB = "block_pool"  # the lab whose parts this file holds


class FreeBlockQueue:
    """Free block ids in eviction order, head first (vLLM's ``FreeKVCacheBlockQueue``).

    ``popleft`` takes the head, ``append`` puts a block at the tail, and ``remove`` takes a block
    from anywhere (a cached block hit while free), all O(1): vLLM links its blocks into a doubly
    linked list for this; an insertion-ordered dict does the same here.
    """

    # Given (the engine's own, not swapped): the attributes and special methods the parts below use.
    def __init__(self, block_ids: list[int]):
        self._blocks: dict[int, None] = dict.fromkeys(block_ids)

    def __len__(self) -> int:
        return len(self._blocks)

    def __iter__(self):
        return iter(self._blocks)

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._blocks

    def popleft(self) -> int:
        """Take the head (the block to hand out next, least recently freed) off the queue and
        return it; the queue is not empty (the allocator checks)."""
        block_id = next(iter(self._blocks))
        del self._blocks[block_id]
        return block_id

    def append(self, block_id: int) -> None:
        """Put a freed block at the tail: it is handed out again after every block already free.
        A block free already is a bug (AssertionError)."""
        assert block_id not in self._blocks, f"block {block_id} is free already"
        self._blocks[block_id] = None

    def remove(self, block_id: int) -> None:
        """Take a block out of the middle of the queue (a cached free block hit again), in O(1)."""
        del self._blocks[block_id]


class BlockAllocator:
    """A free queue of physical block ids with a reference count per block.

    Invariants: a block is either on the free queue (refcount 0) or referenced (refcount >= 1),
    never both; a block is in ``shared`` exactly while its refcount is above 1. Blocks are handed out from the head of the queue and freed blocks go to the
    tail, so a block freed now is reused last (least recently used first: with prefix caching
    the head is the cached block evicted next; vLLM's ``FreeKVCacheBlockQueue``). The queue is
    a :class:`FreeBlockQueue`, so a cached block hit while free leaves it from the middle in O(1).

    Args:
        num_blocks: physical blocks in the pool.
        shuffle_seed: when given, the initial free list is shuffled with this seed, so that block
            tables visibly point anywhere in the pool.
        null_block: keep block 0 out of the free queue for good (vLLM v1's ``BlockPool.null_block``,
            a placeholder block table entries can point at): ``num_blocks - 1`` blocks are usable.
    """

    # Given (the engine's own, not swapped): the attributes and special methods the parts below use.
    def __init__(self, num_blocks: int, shuffle_seed: int | None = None, null_block: bool = False):
        order = list(range(1 if null_block else 0, num_blocks))
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(order)
        self.num_blocks = num_blocks
        self.free_blocks = FreeBlockQueue(order)
        self.ref_counts = [0] * num_blocks
        self.shared: set[int] = set()  # blocks with refcount > 1 (kept so that usage() need not scan)
        self.num_usable = len(order)  # num_blocks, less the null block

    def allocate(self) -> int:
        """Take one block from the free list with refcount 1. Raises NoFreeBlocksError when empty."""
        if not self.free_blocks:
            raise NoFreeBlocksError("no free KV blocks")
        block_id = self.free_blocks.popleft()
        assert self.ref_counts[block_id] == 0
        self.ref_counts[block_id] = 1
        return block_id

    def incref(self, block_id: int) -> None:
        """Share a referenced block (copy-on-write forks and prefix caching share blocks this way):
        one more reference, and the block is in ``shared``. Sharing a free block is a bug (AssertionError)."""
        assert self.ref_counts[block_id] >= 1, f"block {block_id} is free"
        self.ref_counts[block_id] += 1
        self.shared.add(block_id)

    def touch(self, block_id: int) -> None:
        """Take one more reference to a cached block, free or not (vLLM's ``BlockPool.touch``): a
        free one leaves the free queue first, so no allocation can evict it now. Above refcount 1 the
        block is in ``shared``."""
        if self.ref_counts[block_id] == 0:
            self.free_blocks.remove(block_id)
            self.ref_counts[block_id] += 1
        self.ref_counts[block_id] += 1
        if self.ref_counts[block_id] > 1:
            self.shared.add(block_id)

    def free(self, block_id: int) -> bool:
        """Drop one reference; the block leaves ``shared`` at refcount 1 and returns to the free list
        at 0. Returns True then, else False. Freeing a free block is a bug (AssertionError)."""
        assert self.ref_counts[block_id] >= 1, f"block {block_id} freed twice"
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 1:
            self.shared.discard(block_id)
        if self.ref_counts[block_id] == 0:
            self.free_blocks.append(block_id)
            return True
        return False
