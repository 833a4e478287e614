"""Lab lookahead: Speculative decoding: lookahead slots and rollback / 投机解码：前瞻槽位与回滚.

Tentative slots for k draft tokens from free blocks only (fewer when the pool runs short), and after
verification giving back the rejected drafts' slots, freeing every block left with no verified
token.

只用空闲块为 k 个草稿 token 分配暂定槽位（块池不够时少分配），验证之后归还被拒草稿的槽位，并释放不再含有已验证的 token 的块。

Your part plugs into the engine in place of its own, in engine/core/lookahead.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade lookahead --impl labs/mine

Cut by `python -m lessons labs build` from engine/core/lookahead.py; work on a copy.

The module engine/core/lookahead.py, for context:

Speculative decoding's lookahead slots in the paged allocator (vLLM v1's
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
from engine.core.sequence import Sequence
from engine.report import FREE

LAB = "lookahead"  # the lab whose parts this file holds


class LookaheadSlotsMixin:
    """Lookahead slots of :class:`~engine.core.block_manager.PagedBlockManager` (its pool, its
    block tables, its ``lookahead``: seq_id -> tentative positions ``[start, end)``)."""

    def allocate_lookahead_slots(self, seq: Sequence, num_lookahead: int) -> int:
        """Tentative slots for up to ``num_lookahead`` draft tokens after ``seq``'s newest token
        (whose own slot the decode step already holds, :meth:`append_slot`). Takes only free blocks:
        speculation never preempts, so where the pool runs short fewer drafts get slots.

        Returns:
            how many lookahead slots ``seq`` now holds (0 .. num_lookahead).
        """
        # TODO(lookahead): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab lookahead: LookaheadSlotsMixin.allocate_lookahead_slots")

    def rollback_lookahead(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """After verification, with ``seq.num_computed_tokens`` counting only verified tokens: give
        back the slots of the rejected drafts (positions ``num_computed_tokens`` .. the lookahead's
        end) and free every block left holding no verified token (the last ones, freed in reverse).

        Returns:
            (the rolled-back slots, the block ids freed).
        """
        # TODO(lookahead): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab lookahead: LookaheadSlotsMixin.rollback_lookahead")
