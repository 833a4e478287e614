"""Lab sliding_window: A sliding window: freeing blocks out of the window / 滑动窗口：释放窗口外的块.

A sliding-window group's remove_skipped_blocks (vLLM v1's): once every token of a block lies before
the next query's window, the block goes back to the pool and its table entry becomes the null block,
so the group holds at most ceil((window - 1) / block_size) + 1 blocks however long the request
grows.

滑动窗口组的 remove_skipped_blocks（vLLM v1 的同名函数）：一个块的所有词元都落在下一个查询的窗口之前时，把块还给块池，块表里的这一项换成空块（null block），于是无论请求多长，该组最多只占 ceil((window - 1) / block_size) + 1 个块。

Your part plugs into the engine in place of its own, in engine/core/single_type_kv_cache_manager.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade sliding_window --impl labs/mine

Cut by `python -m lessons labs build` from engine/core/single_type_kv_cache_manager.py; work on a copy.

The module engine/core/single_type_kv_cache_manager.py, for context:

The block tables of one KV cache group, by attention type (vLLM v1's
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
from engine.core.sequence import Sequence
from engine.report import FORK, FREE, FREED_OUT_OF_WINDOW

LAB = "sliding_window"  # the lab whose parts this file holds


class SlidingWindowManager:
    """The block tables of a sliding-window group (vLLM's ``SlidingWindowManager``).

    Args:
        sliding_window: tokens each query attends to, itself included.
        *args, **kwargs: as :class:`~engine.core.block_manager.PagedBlockManager` (the pool needs its
            null block: ``null_block=True``).
    """

    # Given (the engine's own, not swapped): the attributes the parts below use.
    def __init__(self, *args, sliding_window: int, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.num_null_blocks:
            raise ValueError("a sliding-window group needs a pool with a null block (null_block=True)")
        self.sliding_window = sliding_window
        if self.prefix_cache is not None:
            self.prefix_cache.null_block = NULL_BLOCK

    def remove_skipped_blocks(self, seq: Sequence, num_computed_tokens: int) -> list[int]:
        """Free ``seq``'s blocks that lie wholly before the window of its next query (vLLM's
        ``remove_skipped_blocks``): the first ``num_skipped_tokens(num_computed_tokens) // block_size``
        blocks. Each leaves the table for :data:`NULL_BLOCK` and goes back to the pool (refcount - 1;
        a block shared by a prefix hit stays with its other holders), with a FREE event. Walk back
        from the last skipped block and stop at the first null entry: everything before it was freed
        on an earlier step. Returns the freed block ids, last logical block first."""
        # TODO(sliding_window): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab sliding_window: SlidingWindowManager.remove_skipped_blocks")
