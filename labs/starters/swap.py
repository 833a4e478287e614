"""Lab swap: Swapping: the block mapping out and in / 交换：换出与换入的块映射.

Whether the CPU pool has room for a group's distinct blocks, and moving a group's block tables
between the pools: one new block per distinct block (shared ones once, shared again), the (src, dst)
copies, the source blocks freed.

CPU 池能否放下一个序列组的不同块，以及在两个池之间搬移它的块表：每个不同的块取一个新块（共享块只复制一次、到另一侧再共享），返回 (src, dst) 复制对，释放源块。

Your part plugs into the engine in place of its own, in engine/core/swap_space.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade swap --impl labs/mine

Cut by `python -m lessons labs build` from engine/core/swap_space.py; work on a copy.

The module engine/core/swap_space.py, for context:

Swap preemption's CPU pool in the paged allocator (PagedAttention paper §4.5; vLLM v0's
``BlockSpaceManager.swap_out`` / ``swap_in``).

A swapped-out request's block tables hold CPU block ids while it waits in the scheduler's
``swapped`` queue. A block its sequences share (refcount > 1 within the group) is copied once and
shared again on the other side, with the same refcount.
"""

from __future__ import annotations
from engine.core.accounting import MemoryUsage, swap_space_usage
from engine.core.block_pool import BlockAllocator
from engine.core.kv_cache_manager import Group
from engine.report import SWAP_IN, SWAP_OUT, BlockTableSnapshot

LAB = "swap"  # the lab whose parts this file holds


class SwapSpaceMixin:
    """Swap out and in of :class:`~engine.core.block_manager.PagedBlockManager` (its GPU pool
    ``allocator``, its CPU pool ``cpu_allocator``, its event log)."""

    def can_swap_out(self, group: Group) -> bool:
        """Room in the CPU pool for every block ``group`` holds (shared ones once)?"""
        # TODO(swap): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab swap: SwapSpaceMixin.can_swap_out")

    def _move(self, group: Group, src: BlockAllocator, dst: BlockAllocator, kind: str, take) -> list[tuple[int, int]]:
        # TODO(swap): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab swap: SwapSpaceMixin._move")
