"""Speculative decoding's lookahead slots in the paged allocator (vLLM v1's
``KVCacheManager.allocate_slots(num_lookahead_tokens=k)``).

Before a step that verifies k draft tokens of a decoding sequence, the positions of the drafts
(``num_tokens`` .. ``num_tokens + k - 1``, after the slot of its newest token) need slots: they are
*tentative*, their KV is written by the verification pass but belongs to tokens that may be
rejected. After the step, :meth:`LookaheadSlotsMixin.rollback_lookahead` gives back what the
rejected drafts held: a block left with no verified token is freed. Only verified tokens are ever
hashed into the prefix cache: ``PagedBlockManager.cache_blocks`` hashes up to
``num_computed_tokens`` and only over ``seq.token_ids``, which never hold a draft.
"""

from __future__ import annotations

from engine.core.lab_impl import plug_lab_parts
from engine.core.sequence import Sequence
from engine.report import FREE


class LookaheadSlotsMixin:
    """Lookahead slots of :class:`~engine.core.block_manager.PagedBlockManager` (its pool, its
    block tables, its ``lookahead``: seq_id -> tentative positions ``[start, end)``)."""

    def lookahead_blocks_needed(self, seq: Sequence, num_lookahead: int) -> int:
        """New blocks ``num_lookahead`` tentative slots after ``seq``'s newest token would take."""
        return max(0, self.blocks_needed(seq.num_tokens + num_lookahead) - max(len(seq.block_table), self.blocks_needed(seq.num_tokens)))

    def allocate_lookahead_slots(self, seq: Sequence, num_lookahead: int) -> int:
        """Tentative slots for up to ``num_lookahead`` draft tokens after ``seq``'s newest token
        (whose own slot the decode step already holds, :meth:`append_slot`). Takes only free blocks:
        speculation never preempts, so where the pool runs short fewer drafts get slots.

        Returns:
            how many lookahead slots ``seq`` now holds (0 .. num_lookahead).
        """
        # BEGIN SOLUTION lookahead
        assert seq.seq_id not in self.lookahead, f"sequence {seq.seq_id} already holds lookahead slots"
        assert len(seq.block_table) >= self.blocks_needed(seq.num_tokens), "the newest token's slot comes first (append_slot)"
        granted = num_lookahead
        while granted and self.lookahead_blocks_needed(seq, granted) > self.allocator.num_free:
            granted -= 1
        for _ in range(self.lookahead_blocks_needed(seq, granted)):
            self._take_block(seq)
        if granted:
            self.lookahead[seq.seq_id] = (seq.num_tokens, seq.num_tokens + granted)
        return granted
        # END SOLUTION

    def tentative_slots(self, seq: Sequence) -> list[int]:
        """The physical slots of ``seq``'s lookahead positions this step ([] without any)."""
        start, end = self.lookahead.get(seq.seq_id, (0, 0))
        return self.slot_mapping(seq, start, end) if end > start else []

    def rollback_lookahead(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """After verification, with ``seq.num_computed_tokens`` counting only verified tokens: give
        back the slots of the rejected drafts (positions ``num_computed_tokens`` .. the lookahead's
        end) and free every block left holding no verified token (the last ones, freed in reverse).

        Returns:
            (the rolled-back slots, the block ids freed).
        """
        # BEGIN SOLUTION lookahead
        start, end = self.lookahead.pop(seq.seq_id, (0, 0))
        keep_from = max(start, seq.num_computed_tokens)
        rolled_back = self.slot_mapping(seq, keep_from, end) if end > keep_from else []
        freed = []
        while len(seq.block_table) > self.blocks_needed(seq.num_computed_tokens):
            logical_index = len(seq.block_table) - 1
            block_id = seq.block_table.pop()
            self.allocator.free(block_id)
            freed.append(block_id)
            self.events.emit(FREE, seq.request_id, block_id=block_id, logical_index=logical_index, seq_id=seq.seq_id,
                             detail="rolled back: no verified token left in it")
        return rolled_back, freed
        # END SOLUTION


plug_lab_parts(globals())  # labs: a student's part in place of the engine's (engine/core/lab_impl.py)
