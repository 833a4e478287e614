"""Lab block_pool: The block pool: allocate, free, free-list order, refcounts / 块池：分配、释放、空闲列表顺序与引用计数.

The pool's free queue (head out, tail in, removal from the middle) and the allocator's reference
counts: allocate takes the head with refcount 1, free drops one reference and returns the block to
the tail at 0, incref shares a referenced block, touch takes a cached block back, free or not.

块池的空闲队列（从队头取出、放回队尾、从中间移除）与分配器的引用计数：allocate 取队头并置引用计数为 1，free 减一个引用、归零时把块放回队尾，incref 共享一个已被引用的块，touch 重新引用一个被缓存的块（不论是否空闲）。

Your part plugs into the engine in place of its own, in engine/core/block_pool.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade block_pool --impl labs/mine

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
        # TODO(block_pool): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab block_pool: FreeBlockQueue.popleft")

    def append(self, block_id: int) -> None:
        """Put a freed block at the tail: it is handed out again after every block already free.
        A block free already is a bug (AssertionError)."""
        # TODO(block_pool): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab block_pool: FreeBlockQueue.append")

    def remove(self, block_id: int) -> None:
        """Take a block out of the middle of the queue (a cached free block hit again), in O(1)."""
        # TODO(block_pool): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab block_pool: FreeBlockQueue.remove")


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
        # TODO(block_pool): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab block_pool: BlockAllocator.allocate")

    def incref(self, block_id: int) -> None:
        """Share a referenced block (copy-on-write forks and prefix caching share blocks this way):
        one more reference, and the block is in ``shared``. Sharing a free block is a bug (AssertionError)."""
        # TODO(block_pool): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab block_pool: BlockAllocator.incref")

    def touch(self, block_id: int) -> None:
        """Take one more reference to a cached block, free or not (vLLM's ``BlockPool.touch``): a
        free one leaves the free queue first, so no allocation can evict it now. Above refcount 1 the
        block is in ``shared``."""
        # TODO(block_pool): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab block_pool: BlockAllocator.touch")

    def free(self, block_id: int) -> bool:
        """Drop one reference; the block leaves ``shared`` at refcount 1 and returns to the free list
        at 0. Returns True then, else False. Freeing a free block is a bug (AssertionError)."""
        # TODO(block_pool): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab block_pool: BlockAllocator.free")
