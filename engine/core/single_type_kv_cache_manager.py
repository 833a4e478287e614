"""The block tables of one KV cache group, by attention type (vLLM v1's
``vllm/v1/core/single_type_kv_cache_manager.py``).

A full-attention group keeps every block of a request: it is the paged allocator of the paper,
:class:`~engine.core.block_manager.PagedBlockManager` (vLLM's ``FullAttentionManager``). A
sliding-window group (:class:`SlidingWindowManager`) is the same allocator, with two rules of its
own:

- once every token of a block lies before the window of every future query, the block is freed and
  its table entry replaced by the *null block* (``remove_skipped_blocks``), as decoding goes on and
  between the chunks of a chunked prefill. Its blocks in use stay under
  ``ceil((sliding_window - 1) / block_size) + 1`` plus the block being written;
- a prefix-cache hit needs only the last ``ceil((sliding_window - 1) / block_size)`` blocks before the
  hit's end to be cached; the blocks before them are the null block (``find_longest_cache_hit``).

Entries for skipped blocks stay in the table (as the null block, block 0 of a pool that keeps one),
so logical block ``i`` still holds positions ``i * block_size .. (i + 1) * block_size - 1`` and the
slot mapping is unchanged. The attention kernels read no block wholly outside the window.
"""

from __future__ import annotations

from engine.core.block_manager import PagedBlockManager
from engine.core.kv_cache_interface import SLIDING_WINDOW, KVCacheSpec
from engine.core.lab_impl import plug_lab_parts
from engine.core.sequence import Sequence
from engine.report import FORK, FREE, FREED_OUT_OF_WINDOW

NULL_BLOCK = 0  # vLLM v1's BlockPool.null_block: block 0, kept out of the free queue

FullAttentionManager = PagedBlockManager  # vLLM's name for the paged allocator of a full-attention group


class SlidingWindowManager(PagedBlockManager):
    """The block tables of a sliding-window group (vLLM's ``SlidingWindowManager``).

    Args:
        sliding_window: tokens each query attends to, itself included.
        *args, **kwargs: as :class:`~engine.core.block_manager.PagedBlockManager` (the pool needs its
            null block: ``null_block=True``).
    """

    def __init__(self, *args, sliding_window: int, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.num_null_blocks:
            raise ValueError("a sliding-window group needs a pool with a null block (null_block=True)")
        self.sliding_window = sliding_window
        if self.prefix_cache is not None:
            self.prefix_cache.null_block = NULL_BLOCK

    def is_null_block(self, block_id: int) -> bool:
        return block_id == NULL_BLOCK

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Leading tokens no future query sees: the next query, at position ``num_computed_tokens``,
        attends to ``num_computed_tokens - sliding_window + 1`` onwards."""
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def remove_skipped_blocks(self, seq: Sequence, num_computed_tokens: int) -> list[int]:
        """Free ``seq``'s blocks that lie wholly before the window of its next query (vLLM's
        ``remove_skipped_blocks``): the first ``num_skipped_tokens(num_computed_tokens) // block_size``
        blocks. Each leaves the table for :data:`NULL_BLOCK` and goes back to the pool (refcount - 1;
        a block shared by a prefix hit stays with its other holders), with a FREE event. Walk back
        from the last skipped block and stop at the first null entry: everything before it was freed
        on an earlier step. Returns the freed block ids, last logical block first."""
        # BEGIN SOLUTION sliding_window
        table = seq.block_table
        freed = []
        for logical_index in reversed(range(min(self.num_skipped_tokens(num_computed_tokens) // self.block_size, len(table)))):
            block_id = table[logical_index]
            if block_id == NULL_BLOCK:
                break
            table[logical_index] = NULL_BLOCK
            self.allocator.free(block_id)
            self.events.emit(FREE, seq.request_id, block_id=block_id, logical_index=logical_index, seq_id=seq.seq_id,
                             detail=FREED_OUT_OF_WINDOW)
            freed.append(block_id)
        return freed
        # END SOLUTION

    def can_allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        self.remove_skipped_blocks(seq, seq.num_computed_tokens)  # freeing first, as vLLM's allocate_slots does
        return super().can_allocate_slots(seq, num_new_tokens)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        self.remove_skipped_blocks(seq, seq.num_computed_tokens)
        super().allocate_slots(seq, num_new_tokens)

    def can_append_slot(self, seq: Sequence) -> bool:
        self.remove_skipped_blocks(seq, seq.num_computed_tokens)
        return super().can_append_slot(seq)

    def can_append_slots(self, group) -> bool:
        for seq in group.unfinished_seqs():
            self.remove_skipped_blocks(seq, seq.num_computed_tokens)
        return super().can_append_slots(group)

    def append_slot(self, seq: Sequence) -> tuple[int, int] | None:
        self.remove_skipped_blocks(seq, seq.num_computed_tokens)
        return super().append_slot(seq)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """As the paged allocator's fork; the null entries are copied, not shared."""
        for block_id in parent.block_table:
            if block_id != NULL_BLOCK:
                self.allocator.incref(block_id)
        child.block_table = list(parent.block_table)
        if parent.seq_id in self.num_committed_blocks:
            self.num_committed_blocks[child.seq_id] = self.num_committed_blocks[parent.seq_id]
        self.events.emit(FORK, child.request_id, seq_id=child.seq_id, parent_seq_id=parent.seq_id,
                         detail=f"{sum(b != NULL_BLOCK for b in parent.block_table)} blocks shared")

    def fits_ever(self, seq) -> bool:
        return True  # bounded by the window; the coordinator checks the pool against the full groups

    def find_longest_cache_hit(self, seq: Sequence, max_num_blocks: int) -> list[int]:
        """The cached blocks of ``seq``'s prompt a sliding-window group needs, for a hit of at most
        ``max_num_blocks`` blocks (vLLM's ``SlidingWindowManager.find_longest_cache_hit``). Scanning
        back from block ``max_num_blocks - 1``, the first run of
        ``ceil((sliding_window - 1) / block_size)`` cached blocks ends the hit: those blocks, and
        :data:`NULL_BLOCK` for every block before them. Without such a run, the leading run of cached
        blocks from block 0, however short. Returns the hit, one entry per logical block."""
        if self.prefix_cache is None or not seq.token_ids:
            return []
        hashes = self.prefix_cache.block_hashes(seq.token_ids, max_num_blocks, seq.block_hashes)
        needed = -(-(self.sliding_window - 1) // self.block_size)
        hit = [NULL_BLOCK] * max_num_blocks
        run = 0
        for i in reversed(range(max_num_blocks)):
            block_id = self._cached_block(seq, hashes, i)
            if block_id is None:
                run = 0
                continue
            hit[i] = block_id
            run += 1
            if run >= needed:
                return hit[: i + run]
        return hit[:run]

    def _cached_block(self, seq: Sequence, hashes: list[bytes], i: int) -> int | None:
        """The cached block of ``seq``'s block ``i``, or None. As ``PrefixCache.lookup``, a hit needs
        the block's token ids and its parent hash to equal the prompt's too: a weakened hash (tests
        pass one) must not serve a block computed after another prefix."""
        cache, bs = self.prefix_cache, self.block_size
        block_id = cache.cached_blocks.get(hashes[i])
        if block_id is None or cache.block_token_ids[block_id] != tuple(seq.token_ids[i * bs : (i + 1) * bs]):
            return None
        if cache.parent_hash[block_id] != (hashes[i - 1] if i else None):
            return None
        return block_id

    def _touch_computed_blocks(self, seq: Sequence, hits: list[int]) -> None:
        """A hit's null entries go into the table as they are: no block, nothing to touch."""
        if self.prefix_cache is None:
            return
        num_null = next((i for i, b in enumerate(hits) if b != NULL_BLOCK), len(hits))
        seq.block_table.extend(hits[:num_null])
        super()._touch_computed_blocks(seq, hits[num_null:])
        self.num_committed_blocks[seq.seq_id] = len(hits)

    def _blocks_to_admit(self, group, num_new_tokens: int | None = None, computed_blocks: list[int] | None = None) -> int:
        hits = computed_blocks or []
        num_null = sum(1 for b in hits if b == NULL_BLOCK)
        # A chunk's count is the same either way; a whole prompt's counts its null entries as hits.
        needed = super()._blocks_to_admit(group, num_new_tokens, [b for b in hits if b != NULL_BLOCK])
        return needed if num_new_tokens is not None else needed - num_null


def manager_for(spec: KVCacheSpec, *args, **kwargs) -> PagedBlockManager:
    """The manager of a group of ``spec`` (vLLM's ``spec_manager_map``)."""
    if spec.attention_type == SLIDING_WINDOW:
        return SlidingWindowManager(*args, sliding_window=spec.sliding_window, **kwargs)
    return FullAttentionManager(*args, **kwargs)


plug_lab_parts(globals())  # labs: a student's part in place of the engine's (engine/core/lab_impl.py)
