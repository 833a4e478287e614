"""Lab bug_cow: Find the bug: fork and copy-on-write / 找错误：派生与写时复制.

A copy of fork and copy-on-write with one bug seeded.

派生与写时复制部分的一个副本，其中埋了一个错误。

Your part plugs into the engine in place of its own, in engine/core/block_manager.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade bug_cow --impl labs/mine

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

LAB = "fork_cow"  # the lab whose parts this file holds


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

    def _copy_on_write(self, seq: Sequence, logical_index: int) -> tuple[int, int] | None:
        """Before ``seq`` writes into its logical block ``logical_index``: if that block is shared
        (refcount > 1), give ``seq`` a copy (paper §4.4, Figure 8). Take a new block
        (``self._allocate_block(seq)``), drop ``seq``'s reference to the shared one, point the block
        table at the new block, emit a ``COPY_ON_WRITE`` event (``block_id=src, dst_block_id=dst,
        logical_index=..., seq_id=...``) and return ``(src, dst)``: the engine copies the KV of src
        into dst before the step's forward pass. A block ``seq`` holds alone (refcount 1) is written
        in place: return None.
        """
        table = seq.block_table
        src = table[logical_index]
        if self.allocator.ref_counts[src] >= 1:
            return None  # its own block (or the last holder of a shared one): write in place
        dst = self._allocate_block(seq)
        self.allocator.free(src)
        table[logical_index] = dst
        self.events.emit(COPY_ON_WRITE, seq.request_id, block_id=src, dst_block_id=dst, logical_index=logical_index,
                         seq_id=seq.seq_id)
        return src, dst

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Give ``child`` the blocks ``parent`` holds, shared, not copied (paper §4.4): each block's
        refcount + 1 (``self.allocator.incref``), ``child.block_table`` a new list with the same ids,
        and a ``FORK`` event (``seq_id=child.seq_id, parent_seq_id=parent.seq_id``). Prefix caching:
        the child has offered as many blocks to the cache as its parent (``num_committed_blocks``)."""
        for block_id in parent.block_table:
            self.allocator.incref(block_id)
        child.block_table = list(parent.block_table)
        if parent.seq_id in self.num_committed_blocks:
            self.num_committed_blocks[child.seq_id] = self.num_committed_blocks[parent.seq_id]
            self.prefix_cache.fork(parent.seq_id, child.seq_id)
        self.events.emit(FORK, child.request_id, seq_id=child.seq_id, parent_seq_id=parent.seq_id,
                         detail=f"{len(parent.block_table)} blocks shared")
