"""Lab slot_mapping: Block tables and slot mapping / 块表与槽位映射.

How many blocks hold n tokens, growing a block table for a prefill chunk, and the physical slot of
each position: slot = block_table[pos // block_size] * block_size + pos % block_size, for prefill
and decode.

n 个词元需要几个块、为一段预填充扩展块表，以及每个位置的物理槽位：slot = block_table[pos // block_size] * block_size + pos % block_size，预填充与解码都用它。

Your part plugs into the engine in place of its own, in engine/core/block_manager.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade slot_mapping --impl labs/mine

Cut by `python -m lessons labs build` from engine/core/block_manager.py; work on a copy.

The module engine/core/block_manager.py, for context:

The paged KV allocator: physical blocks, a free list, reference counts and per-request block tables.

A request's tokens are grouped into *logical blocks* of ``block_size`` tokens; its block table maps
each logical block to a *physical block* anywhere in the pool, so a request needs no contiguous
memory and wastes at most one partly filled block (PagedAttention paper §4.2-4.3).

``KVCacheManager`` (``engine/core/kv_cache_manager.py``) is the interface the scheduler talks to; the
pool's free list and reference counts are ``engine/core/block_pool.py``. Two allocators implement it: the paged
one here and the contiguous one of the systems before vLLM (``engine/baselines/contiguous.py``), so the same
scheduler — in the engine and in the model-free simulator — runs on either.

With prefix caching on (``engine/core/prefix_cache.py``), the paged allocator is also vLLM v1's block
pool: full blocks keep a hash, a freed block stays cached and evictable on the free queue, and a
prompt's leading blocks are looked up before its prefill.
"""

from __future__ import annotations
from engine.core.accounting import MemoryUsage
from engine.core.block_pool import BlockAllocator
from engine.core.kv_cache_manager import Group, KVCacheManager
from engine.core.lookahead import LookaheadSlotsMixin
from engine.core.swap_space import SwapSpaceMixin
from engine.core.prefix_cache import HashFn, PrefixCache, hash_block_tokens
from engine.core.radix_cache import RadixCache, RadixFreeQueue
from engine.core.kv_offload import LOADED_BACK, KVOffloadStats, KVOffloadTier
from engine.core.events import EventLog
from engine.report import ALLOCATE, CACHE_HIT, COPY_ON_WRITE, EVICT, FORK, FREE, FREED_CACHED, FREED_STILL_SHARED, BlockTableSnapshot
from engine.core.sequence import Sequence

LAB = "slot_mapping"  # the lab whose parts this file holds


class PagedBlockManager:
    """The paged allocator of PagedAttention (paper §4.2-4.3, vLLM's ``BlockSpaceManager``).

    A request's block table lives on ``seq.block_table``. A request takes a new block only when its
    last block is full; it never reserves ahead, so its only waste is the unfilled tail of its last
    block (internal fragmentation < block_size slots per request) and there is no external
    fragmentation: any free block serves any request.

    Admission keeps a *watermark* of free blocks, as vLLM does (v0 ``BlockSpaceManagerV1.can_allocate``,
    vllm/core/block_manager_v1.py, ``watermark=0.01``: admit only if free - required >= watermark
    blocks, "to avoid frequent cache eviction"): the running requests' next blocks come out of
    that headroom instead of out of a request just admitted, which would be preempted again. One
    difference: vLLM rejects a request that needs more than all blocks but the watermark; here a
    request that fits the empty pool is admitted when nothing else holds memory.

    Prefix caching (``enable_caching``, vLLM v1's automatic prefix caching): a request's leading
    full blocks found in the cache are *touched* (shared, refcount + 1, CACHE_HIT events) instead
    of computed; at most ``num_tokens - 1`` tokens hit, so a prefill always computes its last token.
    Blocks are hashed in :meth:`cache_blocks`, after the step that wrote their KV, so a request
    admitted in the same step cannot hit them. Freed blocks keep their hash on the free queue;
    handing one out again evicts it (EVICT event).

    Args:
        num_blocks: physical blocks in the pool.
        block_size: token slots per block.
        shuffle_seed: shuffle the initial free list (see :class:`BlockAllocator`).
        watermark: share of the blocks (0..1) admission leaves free; ``int(watermark * num_blocks)``
            blocks, as in vLLM (0.01: 9 of 981 blocks; 0 of fewer than 100 blocks).
        enable_caching: automatic prefix caching (needs the sequences' ``token_ids``).
        hash_fn: the block hash (tests pass a weakened one; see ``engine/core/prefix_cache.py``).
        num_cpu_blocks: blocks of the CPU swap space (paper §4.5; vLLM v0's ``swap_space``): a
            second pool of the same layout that swap preemption moves whole requests to; 0 = none.
        null_block: keep block 0 out of the pool as vLLM v1 does (see :class:`BlockAllocator`), so
            that a run beside vLLM can use the same number of usable blocks.
        prefix_cache: with ``enable_caching``, "hash" (vLLM v1's hash chain, ``engine/core/prefix_cache.py``)
            or "radix" (SGLang's radix tree, ``engine/core/radix_cache.py``).
        kv_offload_blocks: with ``enable_caching``, blocks of a CPU tier that evicted cached blocks are
            copied to and hits are loaded back from (``engine/core/kv_offload.py``); 0 = none. Its
            block ids start at ``num_cpu_blocks`` in the host cache, after the swap space's.
        events: the log its block events go to (``engine/core/events.py``); None = a log of its own.
    """

    # Given (the engine's own, not swapped): the attributes the parts below use.
    def __init__(self, num_blocks: int, block_size: int, shuffle_seed: int | None = None, watermark: float = 0.01,
                 enable_caching: bool = False, hash_fn: HashFn = hash_block_tokens, num_cpu_blocks: int = 0,
                 null_block: bool = False, events: EventLog | None = None, prefix_cache: str = "hash", kv_offload_blocks: int = 0):
        if not 0 <= watermark < 1:
            raise ValueError(f"watermark must be a share of the blocks in [0, 1), got {watermark}")
        if null_block and num_blocks < 2:
            raise ValueError("a pool with a null block needs at least 2 blocks")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.attention_block_size = block_size
        self.allocator = BlockAllocator(num_blocks, shuffle_seed, null_block=null_block)
        self.num_null_blocks = int(null_block)
        self.cpu_allocator = BlockAllocator(num_cpu_blocks) if num_cpu_blocks else None
        self.events = events if events is not None else EventLog()
        self.watermark_blocks = int(watermark * num_blocks)
        if prefix_cache not in ("hash", "radix"):
            raise ValueError(f"prefix_cache must be one of hash, radix; got {prefix_cache!r}")
        self.prefix_cache = None
        if enable_caching:
            self.prefix_cache = (RadixCache if prefix_cache == "radix" else PrefixCache)(num_blocks, block_size, hash_fn)
        if isinstance(self.prefix_cache, RadixCache):  # free cached blocks leave in the tree's order: LRU over leaves
            self.allocator.free_blocks = RadixFreeQueue(list(self.allocator.free_blocks), self.prefix_cache)
        if kv_offload_blocks and not enable_caching:
            raise ValueError("kv_offload_blocks needs prefix caching (enable_caching=True): the CPU tier keeps evicted cached blocks")
        self.offload = KVOffloadTier(kv_offload_blocks, base=num_cpu_blocks) if kv_offload_blocks else None
        self.enable_caching = enable_caching
        self.num_committed_blocks: dict[int, int] = {}  # seq_id -> leading blocks already offered to the cache
        self.lookahead: dict[int, tuple[int, int]] = {}  # speculative decoding: seq_id -> tentative positions [start, end)

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ceil(num_tokens / block_size) (0 tokens, 0 blocks)."""
        # TODO(slot_mapping): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab slot_mapping: PagedBlockManager.blocks_needed")

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow ``seq.block_table`` so that positions ``0 .. num_computed_tokens + num_new_tokens - 1``
        all have a slot: one new block (``self._take_block(seq)``, which appends it) per missing
        block, none when the table is long enough already. The caller checked there is room."""
        # TODO(slot_mapping): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab slot_mapping: PagedBlockManager.allocate_slots")

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        """The physical slot of each token position in ``[start, end)`` of ``seq`` (PagedAttention
        paper §4.2): position ``pos`` lies in logical block ``pos // block_size`` at offset
        ``pos % block_size``, so its slot is ``block_table[pos // block_size] * block_size + pos %
        block_size``. A prefill maps its whole chunk, a decode one position. Returns ``end - start``
        ints; every position must lie inside ``seq.block_table``."""
        # TODO(slot_mapping): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab slot_mapping: PagedBlockManager.slot_mapping")
