"""The hybrid KV cache manager: one block table per KV cache group per request, over one pool
(vLLM v1's ``KVCacheCoordinator``, ``vllm/v1/core/kv_cache_coordinator.py``).

Each group (``engine/core/kv_cache_interface.py``) has a manager of its attention type
(``engine/core/single_type_kv_cache_manager.py``): the paged allocator for full attention, the
sliding-window manager for a sliding window. All of them take blocks from the same
:class:`~engine.core.block_pool.BlockAllocator` and write to the same event log; the coordinator
answers the scheduler's :class:`~engine.core.kv_cache_manager.KVCacheManager` interface by asking
every group and adding up their blocks.

A model of one attention type has one group, and its coordinator is that group's manager itself,
:class:`~engine.core.block_manager.PagedBlockManager` (vLLM's ``UnitaryKVCacheCoordinator``):
:func:`make_kv_cache_manager` returns it unchanged.

A request's table of group ``g`` is ``seq.block_tables[g]`` (group 0's is ``seq.block_table``).
Each manager sees a request through a :class:`GroupView`, whose ``block_table`` is its group's.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from engine.core.accounting import MemoryUsage, swap_space_usage
from engine.core.block_manager import PagedBlockManager
from engine.core.block_pool import BlockAllocator
from engine.core.events import EventLog
from engine.core.kv_cache_interface import SLIDING_WINDOW, KVCacheConfig
from engine.core.kv_cache_manager import Group, KVCacheManager
from engine.core.sequence import Sequence
from engine.core.single_type_kv_cache_manager import NULL_BLOCK, SlidingWindowManager, manager_for
from engine.report import BlockTableSnapshot, KVCacheGroupReport


# Why a hybrid KV cache keeps its prefixes as a hash chain per group, and nothing else (docs/hybrid-kv.md).
HYBRID_CACHE_REFUSAL = (
    "a hybrid KV cache (a model with sliding-window layers, such as Gemma 3) caches prefixes as a hash chain per KV "
    "cache group, as vLLM does: use prefix_cache='hash' (--prefix-cache hash) and no CPU tier (kv_offload_blocks=0). "
    "The radix tree and the CPU tier keep one group's blocks; a hybrid model needs a tree that evicts each attention "
    "type's blocks apart (SGLang's SWARadixCache) and a tier whose loads fill every group (docs/hybrid-kv.md)")


class GroupEventLog(EventLog):
    """The shared event log, each event stamped with the group that emitted it (``Event.kv_cache_group``)."""

    def __init__(self, log: EventLog, group_id: int):
        self.log, self.group_id, self.enabled = log, group_id, log.enabled

    def emit(self, kind: str, request_id: int, **fields) -> None:
        self.log.emit(kind, request_id, kv_cache_group=self.group_id, **fields)


class GroupView:
    """A sequence (or a group of them) as group ``group_id``'s manager sees it: ``block_table`` is
    that group's table; every other attribute is the sequence's own."""

    __slots__ = ("target", "group_id")

    def __init__(self, target, group_id: int):
        object.__setattr__(self, "target", target)
        object.__setattr__(self, "group_id", group_id)

    @property
    def block_table(self) -> list[int]:
        return self.target.block_tables_of(self.group_id)

    def __setattr__(self, name, value) -> None:
        if name == "block_table":
            self.target.set_block_table(self.group_id, value)
        else:
            setattr(self.target, name, value)

    def __getattr__(self, name):
        return getattr(self.target, name)

    def unfinished_seqs(self) -> list[GroupView]:
        return [GroupView(s, self.group_id) for s in self.target.unfinished_seqs()]

    @property
    def seqs(self) -> list[GroupView]:
        return [GroupView(s, self.group_id) for s in self.target.seqs]


@dataclass
class _Hit:
    """A prefix-cache hit across groups: each group's blocks (null entries included) and the tokens."""

    blocks: list[list[int]]
    num_tokens: int


class HybridKVCacheCoordinator(KVCacheManager):
    """Block tables for every KV cache group over one pool (vLLM's ``HybridKVCacheCoordinator``).

    Args:
        kv_cache_config: the pool's groups (``get_kv_cache_config``).
        block_size: slots per block, every group's.
        shuffle_seed, watermark, enable_caching, num_cpu_blocks, events: as
            :class:`~engine.core.block_manager.PagedBlockManager`; the pool keeps its null block.
        max_num_batched_tokens: with chunked prefill, the step's token budget, the longest chunk;
            None = prompts are prefilled whole. It bounds what one request holds
            (:meth:`blocks_for_one_request`).

    Raises:
        ValueError: a radix prefix cache or a CPU tier (see ``HYBRID_CACHE_REFUSAL``).
    """

    def __init__(self, kv_cache_config: KVCacheConfig, block_size: int, shuffle_seed: int | None = None,
                 watermark: float = 0.01, enable_caching: bool = False, num_cpu_blocks: int = 0,
                 events: EventLog | None = None, max_num_batched_tokens: int | None = None, **kwargs):
        if kwargs.get("prefix_cache", "hash") != "hash" or kwargs.get("kv_offload_blocks", 0):
            raise ValueError(HYBRID_CACHE_REFUSAL)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.kv_cache_config = kv_cache_config
        self.num_blocks = kv_cache_config.num_blocks
        self.block_size = self.attention_block_size = block_size
        self.events = events if events is not None else EventLog()
        self.enable_caching = enable_caching
        self.allocator = BlockAllocator(self.num_blocks, shuffle_seed, null_block=True)
        # The CPU pool keeps a null block too, so a swapped-out sliding table's null entries stay null.
        self.cpu_allocator = BlockAllocator(num_cpu_blocks + 1, null_block=True) if num_cpu_blocks else None
        self.managers: list[PagedBlockManager] = []
        for gi, group in enumerate(kv_cache_config.kv_cache_groups):
            m = manager_for(group.kv_cache_spec, self.num_blocks, block_size, watermark=watermark, enable_caching=enable_caching,
                            null_block=True, events=GroupEventLog(self.events, gi))
            m.allocator, m.cpu_allocator = self.allocator, self.cpu_allocator
            self.managers.append(m)
        caches = [m.prefix_cache for m in self.managers]
        for m in self.managers:
            m.other_caches = [c for c in caches if c is not None and c is not m.prefix_cache]
        self.watermark_blocks = self.managers[0].watermark_blocks
        self.pending_copies: list[tuple[int, int]] = []

    # --- The pool ----------------------------------------------------------------------------------

    @property
    def num_kv_cache_groups(self) -> int:
        return len(self.managers)

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free_blocks(self) -> int:
        return self.allocator.num_free

    @property
    def prefix_cache(self):
        """The first group's cache (its eviction count is the engine's)."""
        return self.managers[0].prefix_cache

    def _views(self, target) -> list[tuple[PagedBlockManager, GroupView]]:
        return [(m, GroupView(target, gi)) for gi, m in enumerate(self.managers)]

    def _fits(self, needed: int) -> bool:
        return self.managers[0].fits_admission(needed)

    def blocks_for_one_request(self, num_tokens: int) -> int:
        """The most blocks one sequence of up to ``num_tokens`` tokens holds at once, run alone
        (vLLM's ``max_memory_usage_bytes`` per group, added up): a full-attention group every block
        of its tokens; a sliding-window group the same while prompts are prefilled whole (the window
        frees blocks only from the next step on, and a recomputed request prefills all its tokens
        again), and with chunked prefill at most its window less one and a chunk, plus one block
        (the window need not start on a block)."""
        return self._blocks_for_one_request(num_tokens, self.max_num_batched_tokens)

    def _blocks_for_one_request(self, num_tokens: int, chunk: int | None) -> int:
        blocks = -(-num_tokens // self.block_size)
        total = 0
        for m in self.managers:
            if isinstance(m, SlidingWindowManager) and chunk is not None:
                total += min(blocks, -(-(m.sliding_window - 1 + chunk) // self.block_size) + 1)
            else:
                total += blocks
        return total

    def largest_chunk_for(self, num_tokens: int) -> int | None:
        """The largest chunked-prefill budget (``max_num_batched_tokens``) under which one request of
        ``num_tokens`` tokens fits the pool alone; None when no chunk size makes it fit."""
        if self._blocks_for_one_request(num_tokens, 1) > self.num_usable_blocks:
            return None
        low, high = 1, num_tokens
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if self._blocks_for_one_request(num_tokens, mid) <= self.num_usable_blocks else (low, mid - 1)
        return low

    def longest_request(self) -> int:
        """The most tokens one request can hold in the pool alone (:meth:`blocks_for_one_request` within
        the usable blocks): an engine's ``max_model_len`` is capped at it, so that a lone request can
        always finish. Each token takes a slot in every group until a window frees it."""
        low, high = 0, self.num_usable_blocks * self.block_size  # blocks_for_one_request(high + 1) > usable
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if self.blocks_for_one_request(mid) <= self.num_usable_blocks else (low, mid - 1)
        return low

    def fits_ever(self, seq: Group) -> bool:
        """A request's prefill and first decode fit the empty pool, each group holding what
        :meth:`blocks_for_one_request` counts; a request of several sequences must be able to finish
        alone, each group as the paged allocator counts it."""
        first = seq.seqs[0]
        if seq.num_samples == 1:
            return self.blocks_for_one_request(first.num_tokens + 1) <= self.num_usable_blocks
        shared = first.num_prompt_tokens // self.block_size
        own = -(-first.max_len // self.block_size) - shared
        return len(self.managers) * (shared + seq.num_samples * own) <= self.num_usable_blocks

    # --- Admission ---------------------------------------------------------------------------------

    def get_computed_blocks(self, group: Group) -> tuple[_Hit, int]:
        """The longest prefix every group can hit (vLLM's ``HybridKVCacheCoordinator.find_longest_cache_hit``):
        the full-attention groups' hit bounds it; each sliding-window group finds its own hit within
        that length (:meth:`SlidingWindowManager.find_longest_cache_hit`); the shortest one wins, and
        the search repeats until every group agrees. A request of several sequences re-prefilled
        after preemption shares its prompt's blocks among them and takes no hit."""
        if not self.enable_caching or len(group.unfinished_seqs()) > 1:  # forks re-prefilled share their prompt instead
            return _Hit([[] for _ in self.managers], 0), 0
        seq = group.unfinished_seqs()[0]
        hits = [None] * len(self.managers)
        length = None
        for gi, (m, view) in enumerate(self._views(seq)):
            if not isinstance(m, SlidingWindowManager):
                hits[gi] = m._computed_blocks(view)
                length = len(hits[gi]) if length is None else min(length, len(hits[gi]))
        if length is None:
            length = max(0, min(seq.num_tokens - 1, len(seq.token_ids)) // self.block_size)
        while True:
            for gi, (m, view) in enumerate(self._views(seq)):
                if isinstance(m, SlidingWindowManager):
                    hits[gi] = m.find_longest_cache_hit(view, length) if length else []
            shortest = min(len(h) for h in hits)
            if shortest == length or all(len(h) == shortest for h in hits):
                length = shortest
                break
            length = shortest
        blocks = [h[:length] for h in hits]
        return _Hit(blocks, length * self.block_size), length * self.block_size

    def _hit(self, computed_blocks) -> list[list[int]]:
        return computed_blocks.blocks if isinstance(computed_blocks, _Hit) else [[] for _ in self.managers]

    def can_allocate(self, seq: Group, num_new_tokens: int | None = None, computed_blocks=None) -> bool:
        hits = self._hit(computed_blocks)
        return self._fits(sum(m._blocks_to_admit(v, num_new_tokens, hits[gi]) for gi, (m, v) in enumerate(self._views(seq))))

    def allocate(self, seq: Group, num_new_tokens: int | None = None, computed_blocks=None) -> None:
        hits = self._hit(computed_blocks)
        # Every group's hits are held before any group allocates (vLLM touches them all first): a new
        # block of one group must not evict a cached block another group is about to take.
        held = [b for h in hits for b in h if b != NULL_BLOCK]
        for block_id in held:
            self.allocator.touch(block_id)
        others = seq.unfinished_seqs()[1:]
        for gi, (m, view) in enumerate(self._views(seq)):
            for other in others:  # a re-prefilled group: each group's allocate counts the shared prompt as computed
                other.num_computed_tokens = 0
            m.allocate(view, num_new_tokens, hits[gi])
        for block_id in held:
            self.allocator.free(block_id)

    def num_prefill_tokens(self, group: Group, computed_blocks=None) -> int:
        return self.managers[0].num_prefill_tokens(GroupView(group, 0), self._hit(computed_blocks)[0])

    # --- Growing, freeing --------------------------------------------------------------------------

    def remove_skipped_blocks(self, seq: Sequence) -> None:
        """Every sliding-window group frees ``seq``'s blocks out of its window (vLLM's
        ``KVCacheCoordinator.remove_skipped_blocks``)."""
        for m, view in self._views(seq):
            if isinstance(m, SlidingWindowManager):
                m.remove_skipped_blocks(view, seq.num_computed_tokens)

    def can_allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        self.remove_skipped_blocks(seq)
        end = seq.num_computed_tokens + num_new_tokens
        return sum(max(0, m.blocks_needed(end) - len(v.block_table)) for m, v in self._views(seq)) <= self.allocator.num_free

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        for m, view in self._views(seq):
            m.allocate_slots(view, num_new_tokens)

    def can_append_slot(self, seq: Sequence) -> bool:
        self.remove_skipped_blocks(seq)
        return sum(m._blocks_to_append([v]) for m, v in self._views(seq)) <= self.allocator.num_free

    def can_append_slots(self, group: Group) -> bool:
        seqs = group.unfinished_seqs()
        for seq in seqs:
            self.remove_skipped_blocks(seq)
        return sum(m._blocks_to_append([GroupView(s, gi) for s in seqs]) for gi, m in enumerate(self.managers)) <= self.allocator.num_free

    def append_slot(self, seq: Sequence) -> tuple[int, int] | None:
        """Each group's :meth:`append_slot`. A page is one group's in every KV tensor, so a
        copy-on-write pair copies that group's page; pairs past the first wait in
        :meth:`take_pending_copies`, which runs before the same forward pass."""
        copies = [c for m, v in self._views(seq) if (c := m.append_slot(v)) is not None]
        self.pending_copies += copies[1:]
        return copies[0] if copies else None

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def free(self, seq: Sequence) -> None:
        for m, view in reversed(self._views(seq)):
            m.free(view)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        for gi, m in enumerate(self.managers):
            m.fork(GroupView(parent, gi), GroupView(child, gi))

    def cache_blocks(self, seqs: list[Sequence]) -> None:
        for gi, m in enumerate(self.managers):
            m.cache_blocks([GroupView(s, gi) for s in seqs])

    def free_queue(self) -> list[int]:
        return list(self.allocator.free_blocks)

    def cached_free_hashes(self) -> dict[int, str]:
        return {b: h for m in self.managers for b, h in m.cached_free_hashes().items()}

    # --- Swap preemption (per group, one CPU pool) -------------------------------------------------

    def can_swap_out(self, group: Group) -> bool:
        return self.cpu_allocator is not None and sum(
            len(m._distinct_blocks(v)) for m, v in self._views(group)) <= self.cpu_allocator.num_free

    def swap_out(self, group: Group) -> list[tuple[int, int]]:
        return [pair for m, v in self._views(group) for pair in m.swap_out(v)]

    def can_swap_in(self, group: Group) -> bool:
        needed = sum(len(m._distinct_blocks(v)) + m._blocks_to_append(v.unfinished_seqs(), self.cpu_allocator)
                     for m, v in self._views(group))
        return self._fits(needed)

    def swap_in(self, group: Group) -> list[tuple[int, int]]:
        return [pair for m, v in self._views(group) for pair in m.swap_in(v)]

    def free_swapped(self, group: Group) -> None:
        for m, view in self._views(group):
            m.free_swapped(view)

    def cpu_usage(self, swapped: list[Group]) -> MemoryUsage | None:
        if self.cpu_allocator is None:
            return None
        tables, computed = self._tables(swapped)
        cpu = self.cpu_allocator
        return swap_space_usage(tables, computed, self.block_size, cpu.num_blocks - 1, cpu.num_free)

    def cpu_snapshot(self, swapped: list[Group]) -> list[BlockTableSnapshot]:
        return self.managers[self._main_group].cpu_snapshot([GroupView(g, self._main_group) for g in swapped]) if self.cpu_allocator else []

    # --- What attention reads ----------------------------------------------------------------------

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        return self.group_slot_mapping(seq, start, end, self._main_group)

    def attention_block_table(self, seq: Sequence) -> list[int]:
        return seq.block_tables_of(self._main_group)

    def group_slot_mapping(self, seq: Sequence, start: int, end: int, group_id: int) -> list[int]:
        """Group ``group_id``'s slot of each position in ``[start, end)``."""
        return self.managers[group_id].slot_mapping(GroupView(seq, group_id), start, end)

    def group_block_table(self, seq: Sequence, group_id: int) -> list[int]:
        """Group ``group_id``'s block table (null entries where a sliding window freed blocks)."""
        return seq.block_tables_of(group_id)

    # --- Reports -----------------------------------------------------------------------------------

    @property
    def _main_group(self) -> int:
        """The group whose tables the single-table views show: the first full-attention one."""
        return next((gi for gi, g in enumerate(self.kv_cache_config.kv_cache_groups)
                     if g.kv_cache_spec.attention_type != SLIDING_WINDOW), 0)

    def _tables(self, groups: list[Group]) -> tuple[list[list[int]], list[int]]:
        """Every group's tables of ``groups``' sequences with their null entries left out, and the
        computed tokens each table's blocks hold (a table that lost ``k`` leading blocks holds
        ``k * block_size`` fewer)."""
        tables, computed = [], []
        for group in groups:
            for seq in group.unfinished_seqs():
                for gi in range(len(self.managers)):
                    table = seq.block_tables_of(gi)
                    # the null entries lead a sliding table: the first real block by bisection
                    num_null = bisect.bisect_left(table, True, key=lambda b: b != NULL_BLOCK) if isinstance(
                        self.managers[gi], SlidingWindowManager) else 0
                    tables.append(table[num_null:])
                    computed.append(seq.num_computed_tokens - num_null * self.block_size)
        return tables, computed

    def usage(self, running: list[Group], next_waiting: Group | None, bytes_per_slot: int = 0) -> MemoryUsage:
        """The pool in the paper's categories, every group's blocks together; a slot is one token of
        one page (``group_size`` layers' K and V), so ``bytes_per_slot`` is a page's per token."""
        tables, computed = self._tables(running)
        bs = self.block_size
        num_slots = self.num_usable_blocks * bs
        allocated = (self.num_usable_blocks - self.allocator.num_free) * bs
        held = sum(len(t) for t in tables)
        cached_free = sum(len(m.cached_free_blocks()) for m in self.managers) * bs if self.enable_caching else 0
        if not self.allocator.shared:  # every block has one holder: each table's computed tokens, once
            token_states = sum(min(n, len(t) * bs) for t, n in zip(tables, computed))
            return MemoryUsage(num_slots, token_states, 0, allocated - token_states, 0, num_slots - allocated,
                               bytes_per_slot, 0, held, self.num_usable_blocks - self.allocator.num_free, cached_free)
        fill: dict[int, int] = {}
        for table, n in zip(tables, computed):
            for i, block_id in enumerate(table):
                fill[block_id] = max(fill.get(block_id, 0), min(bs, max(0, n - i * bs)))
        token_states = sum(fill.values())
        shared = sum(fill[b] for b in self.allocator.shared if b in fill)
        return MemoryUsage(num_slots, token_states, 0, allocated - token_states, 0, num_slots - allocated,
                           bytes_per_slot, shared, held, self.num_usable_blocks - self.allocator.num_free, cached_free)

    def snapshot(self, running: list[Group]) -> list[BlockTableSnapshot]:
        """The first full-attention group's tables (the paper's view); :meth:`kv_groups` has them all."""
        main = self._main_group
        return self.managers[main].snapshot([GroupView(g, main) for g in running])

    def kv_groups(self, running: list[Group]) -> list[KVCacheGroupReport]:
        """Every group after the step: its attention type, window, layers, block tables and blocks in use."""
        reports = []
        for gi, (m, group) in enumerate(zip(self.managers, self.kv_cache_config.kv_cache_groups)):
            tables = m.snapshot([GroupView(g, gi) for g in running])
            tables = [_without_null_fill(t) for t in tables] if isinstance(m, SlidingWindowManager) else tables
            in_use = len({b for t in tables for b in t.block_table if not m.is_null_block(b)})
            reports.append(KVCacheGroupReport(gi, group.kv_cache_spec.attention_type, group.kv_cache_spec.sliding_window,
                                              list(group.layer_names), tables, in_use))
        return reports


def _without_null_fill(table: BlockTableSnapshot) -> BlockTableSnapshot:
    from dataclasses import replace

    filled = [0 if b == NULL_BLOCK else f for b, f in zip(table.block_table, table.filled)]
    refs = [0 if b == NULL_BLOCK else r for b, r in zip(table.block_table, table.ref_counts)]
    return replace(table, filled=filled, ref_counts=refs)


def make_kv_cache_manager(kv_cache_config: KVCacheConfig | None, num_blocks: int, block_size: int,
                          max_num_batched_tokens: int | None = None, **kwargs) -> KVCacheManager:
    """The KV cache manager of a pool: the paged allocator itself for one group (or no config), a
    :class:`HybridKVCacheCoordinator` for several. ``kwargs`` as :class:`PagedBlockManager`'s;
    ``max_num_batched_tokens`` (chunked prefill's budget) as the coordinator's."""
    if kv_cache_config is None or len(kv_cache_config.kv_cache_groups) == 1:
        return PagedBlockManager(num_blocks, block_size, **kwargs)
    kwargs.pop("null_block", None)
    kwargs.pop("hash_fn", None)
    return HybridKVCacheCoordinator(kv_cache_config, block_size, max_num_batched_tokens=max_num_batched_tokens, **kwargs)
