"""Swap preemption's CPU pool in the paged allocator (PagedAttention paper §4.5; vLLM v0's
``BlockSpaceManager.swap_out`` / ``swap_in``).

A swapped-out request's block tables hold CPU block ids while it waits in the scheduler's
``swapped`` queue. A block its sequences share (refcount > 1 within the group) is copied once and
shared again on the other side, with the same refcount.
"""

from __future__ import annotations

from engine.core.accounting import MemoryUsage, swap_space_usage
from engine.core.block_pool import BlockAllocator
from engine.core.kv_cache_manager import Group
from engine.core.lab_impl import plug_lab_parts
from engine.report import SWAP_IN, SWAP_OUT, BlockTableSnapshot


class SwapSpaceMixin:
    """Swap out and in of :class:`~engine.core.block_manager.PagedBlockManager` (its GPU pool
    ``allocator``, its CPU pool ``cpu_allocator``, its event log)."""

    def _distinct_blocks(self, group: Group) -> dict[int, None]:
        """Every block ``group``'s unfinished sequences hold, each once, in table order."""
        return dict.fromkeys(b for seq in group.unfinished_seqs() for b in seq.block_table if not self.is_null_block(b))

    def can_swap_out(self, group: Group) -> bool:
        """Room in the CPU pool for every block ``group`` holds (shared ones once)?"""
        # BEGIN SOLUTION swap
        return self.cpu_allocator is not None and len(self._distinct_blocks(group)) <= self.cpu_allocator.num_free
        # END SOLUTION

    def swap_out(self, group: Group) -> list[tuple[int, int]]:
        """Move ``group``'s blocks to the CPU pool; returns the ``(gpu_block, cpu_block)`` copies to
        run before this step's forward pass (vLLM's ``blocks_to_swap_out``). The GPU blocks are
        released (a block another request still holds, a prefix-cache hit, stays)."""
        return self._move(group, self.allocator, self.cpu_allocator, SWAP_OUT, lambda seq: self.cpu_allocator.allocate())

    def can_swap_in(self, group: Group) -> bool:
        """Room on the GPU for ``group``'s blocks and for the token each sequence decodes next,
        within the admission watermark?"""
        seqs = group.unfinished_seqs()
        return self.fits_admission(len(self._distinct_blocks(group)) + self._blocks_to_append(seqs, self.cpu_allocator))

    def swap_in(self, group: Group) -> list[tuple[int, int]]:
        """Bring a swapped-out ``group`` back; returns the ``(cpu_block, gpu_block)`` copies
        (``blocks_to_swap_in``). The group then decodes on without recomputing anything."""
        return self._move(group, self.cpu_allocator, self.allocator, SWAP_IN, self._allocate_block)

    def _move(self, group: Group, src: BlockAllocator, dst: BlockAllocator, kind: str, take) -> list[tuple[int, int]]:
        # BEGIN SOLUTION swap
        mapping: dict[int, int] = {}
        for seq in group.unfinished_seqs():
            table = []
            for logical_index, block_id in enumerate(seq.block_table):
                if self.is_null_block(block_id):  # out of a sliding window: nothing to move
                    table.append(block_id)
                    continue
                if block_id in mapping:
                    dst.incref(mapping[block_id])
                else:
                    mapping[block_id] = take(seq)
                    self.events.emit(kind, seq.request_id, block_id=block_id, dst_block_id=mapping[block_id],
                                     logical_index=logical_index, seq_id=seq.seq_id)
                table.append(mapping[block_id])
            for block_id in reversed(seq.block_table):  # the first block freed last, as in free()
                if not self.is_null_block(block_id):
                    src.free(block_id)
            seq.block_table = table
            if self.num_committed_blocks.pop(seq.seq_id, None) is not None:  # swapped in: its blocks are offered to the cache again
                self.prefix_cache.release(seq.seq_id)
        return list(mapping.items())
        # END SOLUTION

    def free_swapped(self, group: Group) -> None:
        """Release a swapped-out group's CPU blocks (it is aborted, or recomputed after a failed step)."""
        for seq in group.unfinished_seqs():
            for block_id in reversed(seq.block_table):
                if not self.is_null_block(block_id):
                    self.cpu_allocator.free(block_id)
            seq.block_table = []

    def cpu_usage(self, swapped: list[Group]) -> MemoryUsage | None:
        """The CPU swap space in the paper's categories (``swap_space_usage``); None without one."""
        if self.cpu_allocator is None:
            return None
        tables = [s.block_table for g in swapped for s in g.unfinished_seqs()]
        computed = [s.num_computed_tokens for g in swapped for s in g.unfinished_seqs()]
        return swap_space_usage(tables, computed, self.block_size, self.cpu_allocator.num_blocks, self.cpu_allocator.num_free)

    def cpu_snapshot(self, swapped: list[Group]) -> list[BlockTableSnapshot]:
        """The swapped requests' block tables, in CPU block ids (the CPU pool lane of the app)."""
        return self._snapshot(swapped, self.cpu_allocator.ref_counts) if self.cpu_allocator else []


plug_lab_parts(globals())  # labs: a student's part in place of the engine's (engine/core/lab_impl.py)
