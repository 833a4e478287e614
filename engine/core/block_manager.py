"""The paged KV allocator: physical blocks, a free list, reference counts and per-request block tables.

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
from engine.core.lab_impl import plug_lab_parts
from engine.core.lookahead import LookaheadSlotsMixin
from engine.core.swap_space import SwapSpaceMixin
from engine.core.prefix_cache import HashFn, PrefixCache, hash_block_tokens
from engine.core.radix_cache import RadixCache, RadixFreeQueue
from engine.core.kv_offload import LOADED_BACK, KVOffloadStats, KVOffloadTier
from engine.core.events import EventLog
from engine.report import ALLOCATE, CACHE_HIT, COPY_ON_WRITE, EVICT, FORK, FREE, FREED_CACHED, FREED_STILL_SHARED, BlockTableSnapshot
from engine.core.sequence import Sequence


class PagedBlockManager(SwapSpaceMixin, LookaheadSlotsMixin, KVCacheManager):
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

    other_caches: list = []  # a hybrid model's other groups' prefix caches over the same pool (engine/core/kv_cache_coordinator.py)

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

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    def blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens: ceil(num_tokens / block_size) (0 tokens, 0 blocks)."""
        # BEGIN SOLUTION slot_mapping
        return -(-num_tokens // self.block_size)
        # END SOLUTION

    @property
    def num_usable_blocks(self) -> int:
        """Blocks requests can hold: the pool less the null block."""
        return self.num_blocks - self.num_null_blocks

    def fits_ever(self, seq: Group) -> bool:
        if seq.num_samples == 1:
            return self.blocks_needed(seq.seqs[0].num_tokens + 1) <= self.num_usable_blocks
        # A group must be able to finish alone, or preempting it would loop forever: at worst every
        # sequence reaches max_len holding its own copy of all but the shared full prompt blocks.
        shared = seq.num_prompt_tokens // self.block_size
        own = self.blocks_needed(seq.seqs[0].max_len) - shared
        return shared + seq.num_samples * own <= self.num_usable_blocks

    def get_computed_blocks(self, group: Group) -> tuple[list[int], int]:
        hits = self._computed_blocks(group.unfinished_seqs()[0])
        return hits, len(hits) * self.block_size

    def can_allocate(self, seq: Group, num_new_tokens: int | None = None, computed_blocks: list[int] | None = None) -> bool:
        return self.fits_admission(self._blocks_to_admit(seq, num_new_tokens, computed_blocks))

    def fits_admission(self, needed: int, num_free: int | None = None) -> bool:
        """The admission rule: do ``needed`` new blocks fit the free ones and leave the watermark
        free? ``num_free``: None = the pool's (the simulator's lock-step pool passes its own count)."""
        if num_free is None:
            num_free = self.allocator.num_free
        if num_free == self.num_usable_blocks:  # nothing runs: the watermark must not keep out a request that fits
            return needed <= num_free
        return num_free - needed >= self.watermark_blocks

    def allocate(self, seq: Group, num_new_tokens: int | None = None, computed_blocks: list[int] | None = None) -> None:
        first, *others = seq.unfinished_seqs()
        assert not first.block_table, f"request {first.request_id} already holds blocks"
        hits = self._computed_blocks(first) if computed_blocks is None else computed_blocks
        self._touch_computed_blocks(first, hits)
        end = first.num_tokens if num_new_tokens is None else len(hits) * self.block_size + num_new_tokens
        for _ in range(self.blocks_needed(end) - len(first.block_table)):
            self._take_block(first)
        shared = self._shared_prompt_blocks(seq)
        for other in others:  # re-prefill of a group: the full prompt blocks once, each tail its own
            assert not other.block_table and other.num_computed_tokens == 0
            for block_id in first.block_table[:shared]:
                self.allocator.incref(block_id)
            other.block_table = first.block_table[:shared]
            other.num_computed_tokens = shared * self.block_size  # computed this step by `first`
            for _ in range(self.blocks_needed(other.num_tokens) - shared):
                self._take_block(other)

    def num_prefill_tokens(self, group: Group, computed_blocks: list[int] | None = None) -> int:
        # After the cache lookup, not before (GeeeekExplorer/nano-vllm#211): hit tokens are not computed.
        first, *others = group.unfinished_seqs()
        num_hit = len(self._computed_blocks(first) if computed_blocks is None else computed_blocks)
        return group.num_new_tokens - (len(others) * self._shared_prompt_blocks(group) + num_hit) * self.block_size

    def _computed_blocks(self, seq: Sequence) -> list[int]:
        """Cached blocks for ``seq``'s leading full blocks, at most
        ``(num_tokens - 1) // block_size`` of them: the last token is always computed, since its
        logits choose the next token (vllm-project/vllm#11186,
        GeeeekExplorer/nano-vllm#144). Only blocks whose token ids the
        sequence carries are looked up (the simulator carries its prompts' ids, not its outputs')."""
        if self.prefix_cache is None or seq.num_computed_tokens or not seq.token_ids:
            return []
        num_blocks = min(seq.num_tokens - 1, len(seq.token_ids)) // self.block_size
        hits = self.prefix_cache.match(seq.token_ids, num_blocks, seq.block_hashes)
        if self.offload is None or not self.offload.entries or len(hits) == num_blocks:
            return hits
        hashes = self.prefix_cache.block_hashes(seq.token_ids, num_blocks, seq.block_hashes)
        return hits + [-1 - cpu for cpu in self.offload.lookup(seq.token_ids, hashes, len(hits), self.block_size)]

    def _touch_computed_blocks(self, seq: Sequence, hits: list[int]) -> None:
        """Put the cache hits in ``seq``'s block table before any new block is allocated, so the
        allocation cannot evict them (the scheduler sets ``num_computed_tokens`` and counts them).
        Hits in the CPU tier (negative entries ``-1 - cpu_block``, after the GPU ones) get a GPU block
        each and a copy back, and enter the GPU cache."""
        if self.prefix_cache is None:
            return
        on_cpu = [-1 - b for b in hits if b < 0]
        hits = hits[: len(hits) - len(on_cpu)]
        for logical_index, block_id in enumerate(hits, start=len(seq.block_table)):  # after a sliding window's null entries
            self.allocator.touch(block_id)
            seq.block_table.append(block_id)
            self.events.emit(CACHE_HIT, seq.request_id, block_id=block_id, logical_index=logical_index, seq_id=seq.seq_id,
                             block_hash=self.prefix_cache.block_hash[block_id].hex())
        self.prefix_cache.lock(seq.seq_id, hits)
        self.num_committed_blocks[seq.seq_id] = len(hits)
        if on_cpu:
            self._load_back(seq, on_cpu)

    def _load_back(self, seq: Sequence, cpu_blocks: list[int]) -> None:
        """CPU-tier hits continue ``seq``'s GPU hits: a GPU block each, the copy queued, then cached.
        All of them are pinned first: a GPU block taken for one may evict a cached block into the
        full tier, which must not drop a hit of this request and reuse its CPU block."""
        start = len(seq.block_table)
        hashes = self.prefix_cache.block_hashes(seq.token_ids, start + len(cpu_blocks), seq.block_hashes)
        self.offload.pin(cpu_blocks)
        for cpu, block_hash in zip(cpu_blocks, hashes[start:]):
            block_id = self._allocate_block(seq)
            self.offload.load(cpu, block_id, block_hash)
            self.events.emit(CACHE_HIT, seq.request_id, block_id=block_id, logical_index=len(seq.block_table), seq_id=seq.seq_id,
                             block_hash=block_hash.hex(), detail=f"{LOADED_BACK} {cpu}")
            seq.block_table.append(block_id)
        end = len(seq.block_table)
        replaced = self.prefix_cache.commit(seq.seq_id, seq.token_ids, seq.block_table, start, end, seq.block_hashes)
        assert not replaced, "a block loaded back was on the GPU already"
        self.num_committed_blocks[seq.seq_id] = end

    def take_offload_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The CPU tier's copies queued since the last step: ``(gpu, cpu)`` offloads, ``(cpu, gpu)`` loads."""
        return self.offload.take_copies() if self.offload is not None else ([], [])

    def discard_offload_copies(self, copies_out: list[tuple[int, int]], copies_in: list[tuple[int, int]]) -> None:
        """A step failed before its CPU-tier copies ran (its requests requeued, their blocks freed):
        the tier forgets the blocks it never received, and each GPU block that was never loaded
        back leaves the prefix cache, so that no later hit reads KV that was never written."""
        if self.offload is None:
            return
        self.offload.discard(copies_out, copies_in)
        free = self.allocator.free_blocks
        for _, block_id in reversed(copies_in):  # a path's deepest block first: the radix tree evicts leaves
            assert block_id in free, f"block {block_id}, loaded back in a failed step, is still held"
            if self.prefix_cache.block_hash[block_id] is not None:
                free.remove(block_id)
                self.prefix_cache.evict(block_id)
                free.append(block_id)

    def offload_stats(self) -> KVOffloadStats | None:
        """The step's traffic between the GPU cache and the CPU tier (None without a tier)."""
        if self.offload is None:
            return None
        return self.offload.take_stats(sum(h is not None for h in self.prefix_cache.block_hash))

    def cache_blocks(self, seqs: list[Sequence]) -> None:
        cache = self.prefix_cache
        if cache is None:
            return
        for seq in seqs:
            num_full = min(seq.num_computed_tokens, len(seq.token_ids)) // self.block_size
            start = self.num_committed_blocks.get(seq.seq_id, 0)
            if num_full <= start:
                continue
            for logical_index, block_id in cache.commit(seq.seq_id, seq.token_ids, seq.block_table, start, num_full, seq.block_hashes):
                self._use_cached_copy(seq, logical_index, block_id)
            self.num_committed_blocks[seq.seq_id] = num_full

    def _use_cached_copy(self, seq: Sequence, logical_index: int, block_id: int) -> None:
        """The radix cache holds this block's tokens already, in ``block_id``: ``seq`` takes that
        block and frees its own copy (same tokens after the same prefix, so the same KV)."""
        own = seq.block_table[logical_index]
        self.allocator.touch(block_id)
        seq.block_table[logical_index] = block_id
        self.allocator.free(own)
        self.events.emit(FREE, seq.request_id, block_id=own, logical_index=logical_index, seq_id=seq.seq_id,
                         detail=f"a copy of cached block {block_id}")
        self.events.emit(CACHE_HIT, seq.request_id, block_id=block_id, logical_index=logical_index, seq_id=seq.seq_id,
                         block_hash=self.prefix_cache.block_hash[block_id].hex())

    def can_allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table) <= self.allocator.num_free

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        """Grow ``seq.block_table`` so that positions ``0 .. num_computed_tokens + num_new_tokens - 1``
        all have a slot: one new block (``self._take_block(seq)``, which appends it) per missing
        block, none when the table is long enough already. The caller checked there is room."""
        # BEGIN SOLUTION slot_mapping
        for _ in range(self.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)):
            self._take_block(seq)
        # END SOLUTION

    def can_append_slot(self, seq: Sequence) -> bool:
        return self._blocks_to_append([seq]) <= self.allocator.num_free

    def can_append_slots(self, group: Group) -> bool:
        return self._blocks_to_append(group.unfinished_seqs()) <= self.allocator.num_free

    def append_slot(self, seq: Sequence) -> tuple[int, int] | None:
        """Make room for the token at position ``seq.num_tokens - 1`` (decode; the token is already
        counted in ``num_tokens``). A new block (``self._take_block(seq)``) only when that position is
        past the last block of ``seq.block_table``: a request never holds a block ahead of its tokens,
        so its waste is the unfilled tail of its last block, under ``block_size`` slots. A position
        inside an existing block goes to :meth:`_copy_on_write` (a shared block is copied first).

        Returns:
            the copy-on-write pair ``(src, dst)`` from :meth:`_copy_on_write`, or None.
        """
        # BEGIN SOLUTION append_slot
        table, pos = seq.block_table, seq.num_tokens - 1
        if pos >= len(table) * self.block_size:
            self._take_block(seq)
            return None
        return self._copy_on_write(seq, pos // self.block_size)
        # END SOLUTION

    def _copy_on_write(self, seq: Sequence, logical_index: int) -> tuple[int, int] | None:
        """Before ``seq`` writes into its logical block ``logical_index``: if that block is shared
        (refcount > 1), give ``seq`` a copy (paper §4.4, Figure 8). Take a new block
        (``self._allocate_block(seq)``), drop ``seq``'s reference to the shared one, point the block
        table at the new block, emit a ``COPY_ON_WRITE`` event (``block_id=src, dst_block_id=dst,
        logical_index=..., seq_id=...``) and return ``(src, dst)``: the engine copies the KV of src
        into dst before the step's forward pass. A block ``seq`` holds alone (refcount 1) is written
        in place: return None.
        """
        # BEGIN SOLUTION fork_cow
        table = seq.block_table
        src = table[logical_index]
        if self.allocator.ref_counts[src] == 1:
            return None  # its own block (or the last holder of a shared one): write in place
        dst = self._allocate_block(seq)
        self.allocator.free(src)
        table[logical_index] = dst
        self.events.emit(COPY_ON_WRITE, seq.request_id, block_id=src, dst_block_id=dst, logical_index=logical_index,
                         seq_id=seq.seq_id)
        return src, dst
        # END SOLUTION

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Give ``child`` the blocks ``parent`` holds, shared, not copied (paper §4.4): each block's
        refcount + 1 (``self.allocator.incref``), ``child.block_table`` a new list with the same ids,
        and a ``FORK`` event (``seq_id=child.seq_id, parent_seq_id=parent.seq_id``). Prefix caching:
        the child has offered as many blocks to the cache as its parent (``num_committed_blocks``)."""
        # BEGIN SOLUTION fork_cow
        for block_id in parent.block_table:
            self.allocator.incref(block_id)
        child.block_table = list(parent.block_table)
        if parent.seq_id in self.num_committed_blocks:
            self.num_committed_blocks[child.seq_id] = self.num_committed_blocks[parent.seq_id]
            self.prefix_cache.fork(parent.seq_id, child.seq_id)
        self.events.emit(FORK, child.request_id, seq_id=child.seq_id, parent_seq_id=parent.seq_id,
                         detail=f"{len(parent.block_table)} blocks shared")
        # END SOLUTION

    def free(self, seq: Sequence) -> None:
        # Freed in reverse, so the request's first block goes back last (as vLLM does).
        for logical_index in reversed(range(len(seq.block_table))):
            block_id = seq.block_table[logical_index]
            if self.is_null_block(block_id):  # a sliding window's entry for blocks already freed
                continue
            returned = self.allocator.free(block_id)
            if self.events.enabled:  # the simulator's null log: no text to format
                detail = "" if returned else f"{FREED_STILL_SHARED}, refcount {self.allocator.ref_counts[block_id]}"
                if returned and self._is_cached(block_id):
                    detail = FREED_CACHED
                self.events.emit(FREE, seq.request_id, block_id=block_id, logical_index=logical_index, seq_id=seq.seq_id, detail=detail)
        seq.block_table = []
        if self.num_committed_blocks.pop(seq.seq_id, None) is not None:
            self.prefix_cache.release(seq.seq_id)
        self.lookahead.pop(seq.seq_id, None)

    def is_null_block(self, block_id: int) -> bool:
        """Is ``block_id`` the null block (vLLM v1's ``BlockPool.null_block``): the placeholder a
        sliding-window block table holds for blocks freed out of the window? Never in a full-attention
        table (``SlidingWindowManager`` answers for its own)."""
        return False

    def _is_cached(self, block_id: int) -> bool:
        return self.prefix_cache is not None and self.prefix_cache.block_hash[block_id] is not None

    def free_queue(self) -> list[int]:
        """The free queue, head (evicted next, least recently used) first."""
        return list(self.allocator.free_blocks)

    def cached_free_blocks(self) -> list[int]:
        """Free blocks that still hold a cached block's KV (cached and evictable), head first."""
        if self.prefix_cache is None:
            return []
        hashes = self.prefix_cache.block_hash  # read once: this runs over the whole free queue every step
        return [b for b in self.allocator.free_blocks if hashes[b] is not None]

    def cached_free_hashes(self) -> dict[int, str]:
        if self.prefix_cache is None:
            return {}
        return {b: self.prefix_cache.block_hash[b].hex() for b in self.cached_free_blocks()}

    def _shared_prompt_blocks(self, group: Group) -> int:
        """Full prompt blocks that a group's (re)prefill shares among its sequences."""
        return group.num_prompt_tokens // self.block_size

    def _blocks_to_admit(self, group: Group, num_new_tokens: int | None = None, computed_blocks: list[int] | None = None) -> int:
        """Free blocks an admission takes: new blocks, and the cache hits now on the free queue
        (touching takes them off it). ``num_new_tokens``: a first chunk, after the hits."""
        seqs = group.unfinished_seqs()
        shared = self._shared_prompt_blocks(group)
        hits = self._computed_blocks(seqs[0]) if computed_blocks is None else computed_blocks
        free_hits = sum(1 for b in hits if b < 0 or self.allocator.ref_counts[b] == 0)  # a CPU-tier hit takes a free block
        if num_new_tokens is not None:
            return self.blocks_needed(len(hits) * self.block_size + num_new_tokens) - len(hits) + free_hits
        return sum(self.blocks_needed(s.num_tokens) for s in seqs) - (len(seqs) - 1) * shared - len(hits) + free_hits

    def _blocks_to_append(self, seqs: list[Sequence], allocator: BlockAllocator | None = None) -> int:
        """New blocks that decoding one token for each of ``seqs`` takes: one per sequence whose
        last block is full, and one per copy-on-write: every writer of a shared block copies it,
        except the last holder when all holders write (it sees refcount 1 and writes in place).
        ``allocator``: whose refcounts the block tables refer to (a swapped group's: the CPU pool's)."""
        ref_counts = (allocator or self.allocator).ref_counts
        needed, writers = 0, {}
        for seq in seqs:
            pos = seq.num_tokens - 1
            if pos >= len(seq.block_table) * self.block_size:
                needed += 1
            else:
                block_id = seq.block_table[pos // self.block_size]
                writers[block_id] = writers.get(block_id, 0) + 1
        for block_id, count in writers.items():
            refs = ref_counts[block_id]
            if refs > 1:
                needed += count - (count == refs)
        return needed

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        """The physical slot of each token position in ``[start, end)`` of ``seq`` (PagedAttention
        paper §4.2): position ``pos`` lies in logical block ``pos // block_size`` at offset
        ``pos % block_size``, so its slot is ``block_table[pos // block_size] * block_size + pos %
        block_size``. A prefill maps its whole chunk, a decode one position. Returns ``end - start``
        ints; every position must lie inside ``seq.block_table``."""
        # BEGIN SOLUTION slot_mapping
        bs, table = self.block_size, seq.block_table
        return [table[pos // bs] * bs + pos % bs for pos in range(start, end)]
        # END SOLUTION

    def attention_block_table(self, seq: Sequence) -> list[int]:
        return seq.block_table

    def usage(self, running: list[Group], next_waiting: Group | None, bytes_per_slot: int = 0) -> MemoryUsage:
        """The GPU pool (the null block, when kept, is left out: ``num_usable_blocks`` make the total)."""
        num_slots = self.num_usable_blocks * self.block_size
        allocated = (self.num_usable_blocks - self.allocator.num_free) * self.block_size
        cached_free = len(self.cached_free_blocks()) * self.block_size if self.prefix_cache else 0
        if self.prefix_cache is None and not self.allocator.shared:  # every block has one holder
            seqs = [s for g in running for s in g.unfinished_seqs()]
            token_states = sum(seq.num_computed_tokens for seq in seqs)
            held = sum(len(seq.block_table) for seq in seqs)
            return MemoryUsage(num_slots, token_states, 0, allocated - token_states, 0, num_slots - allocated,
                               bytes_per_slot, 0, held, held)
        # Each physical slot once. The holders of a shared block wrote the same tokens into it, so
        # summing every sequence's tokens counts a block with refcount r (r - 1) times too often.
        # A shared block is full unless it is the partly filled last block of its holders.
        bs, refs = self.block_size, self.allocator.ref_counts
        seqs = [s for g in running for s in g.unfinished_seqs()]
        partial = {s.block_table[s.num_computed_tokens // bs]: s.num_computed_tokens % bs
                   for s in seqs if s.num_computed_tokens % bs}
        shared_fill = {b: partial.get(b, bs) for b in self.allocator.shared}
        token_states = sum(s.num_computed_tokens for s in seqs) - sum((refs[b] - 1) * n for b, n in shared_fill.items())
        held = sum(len(s.block_table) for s in seqs)
        return MemoryUsage(num_slots, token_states, 0, allocated - token_states, 0, num_slots - allocated,
                           bytes_per_slot, sum(shared_fill.values()), held, self.num_usable_blocks - self.allocator.num_free,
                           cached_free)

    def snapshot(self, running: list[Group]) -> list[BlockTableSnapshot]:
        return self._snapshot(running, self.allocator.ref_counts)

    def _snapshot(self, groups: list[Group], refs: list[int]) -> list[BlockTableSnapshot]:
        bs = self.block_size
        return [
            BlockTableSnapshot(
                request_id=seq.request_id,
                block_table=list(seq.block_table),
                filled=[min(bs, max(0, seq.num_computed_tokens - i * bs)) for i in range(len(seq.block_table))],
                seq_id=seq.seq_id,
                index=seq.index,
                ref_counts=[refs[b] for b in seq.block_table],
            )
            for group in groups
            for seq in group.unfinished_seqs()
        ]

    def _allocate_block(self, seq: Sequence) -> int:
        """A block from the head of the free queue; a cached one is evicted (its hash dropped)."""
        block_id = self.allocator.allocate()
        if self.prefix_cache is not None:
            if self.offload is not None and self.prefix_cache.block_hash[block_id] is not None:
                self.offload.offload(block_id, *self.prefix_cache.describe(block_id))
            block_hash = self.prefix_cache.evict(block_id)
            for cache in self.other_caches:  # the other groups' caches over the same pool (a hybrid model)
                block_hash = cache.evict(block_id) or block_hash
            if block_hash is not None:
                self.events.emit(EVICT, seq.request_id, block_id=block_id, seq_id=seq.seq_id, block_hash=block_hash.hex())
        return block_id

    def _take_block(self, seq: Sequence) -> None:
        block_id = self._allocate_block(seq)
        self.events.emit(ALLOCATE, seq.request_id, block_id=block_id, logical_index=len(seq.block_table), seq_id=seq.seq_id)
        seq.block_table.append(block_id)


plug_lab_parts(globals())  # labs: a student's part in place of the engine's (engine/core/lab_impl.py)
