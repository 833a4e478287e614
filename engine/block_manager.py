"""The paged KV allocator: physical blocks, a free list, reference counts and per-request block tables.

A request's tokens are grouped into *logical blocks* of ``block_size`` tokens; its block table maps
each logical block to a *physical block* anywhere in the pool, so a request needs no contiguous
memory and wastes at most one partly filled block (PagedAttention paper §4.2-4.3).

``KVCacheManager`` is the interface the scheduler talks to. Two allocators implement it: the paged
one here and the contiguous one of the systems before vLLM (``engine/contiguous.py``), so the same
scheduler — in the engine and in the model-free simulator — runs on either.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import deque

from engine.accounting import MemoryUsage
from engine.report import ALLOCATE, FREE, BlockTableSnapshot, Event
from engine.sequence import Sequence


class NoFreeBlocksError(RuntimeError):
    """Raised when a block is asked for and the free list is empty (the scheduler checks first)."""


class BlockAllocator:
    """A free list of physical block ids with a reference count per block.

    Invariants: a block is either on the free list (refcount 0) or referenced (refcount >= 1),
    never both. Blocks are handed out from the front of the free list and freed blocks go to the
    back, so a block freed now is reused last.

    Args:
        num_blocks: physical blocks in the pool.
        shuffle_seed: when given, the initial free list is shuffled with this seed, so that block
            tables visibly point anywhere in the pool.
    """

    def __init__(self, num_blocks: int, shuffle_seed: int | None = None):
        order = list(range(num_blocks))
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(order)
        self.num_blocks = num_blocks
        self.free_blocks: deque[int] = deque(order)
        self.ref_counts = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self.free_blocks)

    def allocate(self) -> int:
        """Take one block from the free list with refcount 1. Raises NoFreeBlocksError when empty."""
        if not self.free_blocks:
            raise NoFreeBlocksError("no free KV blocks")
        block_id = self.free_blocks.popleft()
        assert self.ref_counts[block_id] == 0
        self.ref_counts[block_id] = 1
        return block_id

    def incref(self, block_id: int) -> None:
        """Share a referenced block (copy-on-write forks and prefix caching share blocks this way)."""
        assert self.ref_counts[block_id] >= 1, f"block {block_id} is free"
        self.ref_counts[block_id] += 1

    def free(self, block_id: int) -> bool:
        """Drop one reference; the block returns to the free list at refcount 0. Returns True then."""
        assert self.ref_counts[block_id] >= 1, f"block {block_id} freed twice"
        self.ref_counts[block_id] -= 1
        if self.ref_counts[block_id] == 0:
            self.free_blocks.append(block_id)
            return True
        return False


class KVCacheManager(ABC):
    """What the scheduler asks of a KV allocator (vLLM's block space manager).

    Attributes every implementation sets:
        block_size: slots per block, as the pool is shown and stored.
        num_blocks: blocks in the pool; capacity is ``num_blocks * block_size`` slots.
        attention_block_size: block size of the block tables handed to attention
            (paged: block_size; contiguous: 1, a range is a run of consecutive 1-slot blocks).
        events: ALLOCATE / FREE events since the engine last drained them.
    """

    block_size: int
    num_blocks: int
    attention_block_size: int
    events: list[Event]
    # The model-free simulator turns per-block events off: on 100,000 requests they would be
    # millions of objects nobody reads. The engine keeps them on (the event log of every step).
    record_events: bool = True

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @abstractmethod
    def fits_ever(self, seq: Sequence) -> bool:
        """Could ``seq`` be admitted to an empty pool? (False: reject it, it would wait forever.)"""

    @abstractmethod
    def can_allocate(self, seq: Sequence) -> bool:
        """Is there room now to admit ``seq`` with its ``num_tokens`` tokens?"""

    @abstractmethod
    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` room for its ``num_tokens`` tokens (prefill, or recompute after preemption)."""

    @abstractmethod
    def can_append_slot(self, seq: Sequence) -> bool:
        """Is there room for the token at position ``seq.num_tokens - 1``?"""

    @abstractmethod
    def append_slot(self, seq: Sequence) -> None:
        """Make room for the token at position ``seq.num_tokens - 1`` (decode)."""

    @abstractmethod
    def free(self, seq: Sequence) -> None:
        """Release everything ``seq`` holds (finish, abort or preemption)."""

    @abstractmethod
    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Physical slot of each token position in ``[start, end)`` of ``seq``."""

    @abstractmethod
    def attention_block_table(self, seq: Sequence) -> list[int]:
        """Block ids, in units of ``attention_block_size``, that attention reads for ``seq``."""

    @abstractmethod
    def usage(self, running: list[Sequence], next_waiting: Sequence | None, bytes_per_slot: int = 0) -> MemoryUsage:
        """The pool in the paper's categories (see ``engine/accounting.py``)."""

    @abstractmethod
    def snapshot(self, running: list[Sequence]) -> list[BlockTableSnapshot]:
        """Every live request's block table with the filled slots of each block."""

    # --- Lock-step decode (the simulator's fast-forward) -------------------------------------------
    # Between two events (an admission, a finish, a preemption, an arrival) every running request
    # decodes one token per step, so k such steps can be applied at once. These three methods are
    # what an allocator must answer for that; by default it predicts nothing (0 steps), so the
    # simulator steps one by one and the other two are never called.

    def max_decode_steps(self, running: list[Sequence], limit: int) -> int:
        """Most lock-step decode steps (<= ``limit``) in which every request of ``running`` gets its
        next slot without a preemption. Default 0: this allocator does not predict, step one by one."""
        return 0

    def advance_decode(self, running: list[Sequence], k: int) -> None:
        """Make room for ``k`` more tokens of every running request, exactly as ``k`` rounds of
        :meth:`append_slot` over ``running`` in order would. Requires ``k <= max_decode_steps``.
        An allocator whose :meth:`max_decode_steps` can return more than 0 implements it."""
        raise NotImplementedError(f"{type(self).__name__} does not fast-forward decode")

    def decode_usage_sum(self, running: list[Sequence], next_waiting: Sequence | None, k: int) -> dict[str, int]:
        """Each memory category summed over the next ``k`` lock-step decode steps (slot-steps),
        measured after each step's tokens are computed: step j (1-based) holds ``num_tokens + j - 1``
        computed tokens per request. Called before :meth:`advance_decode`; implemented with it."""
        raise NotImplementedError(f"{type(self).__name__} has no closed-form decode usage")


class PagedBlockManager(KVCacheManager):
    """The paged allocator of PagedAttention (paper §4.2-4.3, vLLM's ``BlockSpaceManager``).

    A request's block table lives on ``seq.block_table``. A request takes a new block only when its
    last block is full; it never reserves ahead, so its only waste is the unfilled tail of its last
    block (internal fragmentation < block_size slots per request) and there is no external
    fragmentation: any free block serves any request.

    Args:
        num_blocks: physical blocks in the pool.
        block_size: token slots per block.
        shuffle_seed: shuffle the initial free list (see :class:`BlockAllocator`).
    """

    def __init__(self, num_blocks: int, block_size: int, shuffle_seed: int | None = None):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.attention_block_size = block_size
        self.allocator = BlockAllocator(num_blocks, shuffle_seed)
        self.events: list[Event] = []

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def fits_ever(self, seq: Sequence) -> bool:
        return self.blocks_needed(seq.num_tokens + 1) <= self.num_blocks

    def can_allocate(self, seq: Sequence) -> bool:
        return self.blocks_needed(seq.num_tokens) <= self.allocator.num_free

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table, f"request {seq.request_id} already holds blocks"
        for _ in range(self.blocks_needed(seq.num_tokens)):
            self._take_block(seq)

    def can_append_slot(self, seq: Sequence) -> bool:
        return seq.num_tokens <= len(seq.block_table) * self.block_size or self.allocator.num_free > 0

    def append_slot(self, seq: Sequence) -> None:
        if seq.num_tokens > len(seq.block_table) * self.block_size:
            self._take_block(seq)
        assert seq.num_tokens <= len(seq.block_table) * self.block_size

    def free(self, seq: Sequence) -> None:
        # Freed in reverse, so the request's first block goes back last (as vLLM does).
        for logical_index in reversed(range(len(seq.block_table))):
            block_id = seq.block_table[logical_index]
            self.allocator.free(block_id)
            if self.record_events:
                self.events.append(Event(FREE, seq.request_id, block_id=block_id, logical_index=logical_index))
        seq.block_table = []

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        bs, table = self.block_size, seq.block_table
        return [table[pos // bs] * bs + pos % bs for pos in range(start, end)]

    def attention_block_table(self, seq: Sequence) -> list[int]:
        return seq.block_table

    def usage(self, running: list[Sequence], next_waiting: Sequence | None, bytes_per_slot: int = 0) -> MemoryUsage:
        allocated = (self.num_blocks - self.allocator.num_free) * self.block_size
        token_states = sum(seq.num_computed_tokens for seq in running)
        return MemoryUsage(
            capacity=self.num_slots,
            token_states=token_states,
            reserved=0,
            internal_fragmentation=allocated - token_states,
            external_fragmentation=0,
            free=self.num_slots - allocated,
            bytes_per_slot=bytes_per_slot,
        )

    def snapshot(self, running: list[Sequence]) -> list[BlockTableSnapshot]:
        bs = self.block_size
        return [
            BlockTableSnapshot(
                request_id=seq.request_id,
                block_table=list(seq.block_table),
                filled=[min(bs, max(0, seq.num_computed_tokens - i * bs)) for i in range(len(seq.block_table))],
            )
            for seq in running
        ]

    def _take_block(self, seq: Sequence) -> None:
        block_id = self.allocator.allocate()
        if self.record_events:
            self.events.append(Event(ALLOCATE, seq.request_id, block_id=block_id, logical_index=len(seq.block_table)))
        seq.block_table.append(block_id)

    # --- Lock-step decode (fast-forward) -----------------------------------------------------------

    def _first_block_steps(self, running: list[Sequence]) -> list[tuple[int, int]]:
        """(step at which each request first needs a new block, its index in running), sorted.

        At lock-step decode step j (1-based) a request with n tokens needs room for n + j - 1
        tokens; it first outgrows its h blocks at j1 = h * block_size - n + 2, then every
        block_size steps. Sorting by (j1, index) gives the order in which single steps take blocks.
        """
        bs = self.block_size
        return sorted((max(1, len(seq.block_table) * bs - seq.num_tokens + 2), i) for i, seq in enumerate(running))

    def max_decode_steps(self, running: list[Sequence], limit: int) -> int:
        # The (free + 1)-th block asked for is the first that cannot be given: it comes in round
        # free // R (rounds are block_size steps apart) from the (free % R)-th request in j1 order.
        if not running:
            return limit
        free = self.allocator.num_free
        order = self._first_block_steps(running)
        first_short = order[free % len(order)][0] + (free // len(order)) * self.block_size
        return max(0, min(limit, first_short - 1))

    def advance_decode(self, running: list[Sequence], k: int) -> None:
        # Take the blocks in the order k single steps would (step by step, running order within a
        # step), so that block tables are identical to stepping one by one.
        bs = self.block_size
        order = self._first_block_steps(running)
        for round_start in range(0, k, bs):
            for j1, i in order:
                if j1 + round_start > k:
                    break
                self._take_block(running[i])

    def decode_usage_sum(self, running: list[Sequence], next_waiting: Sequence | None, k: int) -> dict[str, int]:
        # Step j: a request holds ceil((n + j - 1) / bs) blocks and n + j - 1 token states; both
        # sums over j = 1..k have closed forms (see _ceil_sum).
        bs = self.block_size
        allocated0 = (self.num_blocks - self.allocator.num_free) * bs
        token_states = grown_slots = 0
        for seq in running:
            n = seq.num_tokens
            token_states += k * (n - 1) + k * (k + 1) // 2
            grown_slots += bs * (_ceil_sum(n + k - 1, bs) - _ceil_sum(n - 1, bs) - k * len(seq.block_table))
        allocated = k * allocated0 + grown_slots
        return {
            "token_states": token_states,
            "reserved": 0,
            "internal_fragmentation": allocated - token_states,
            "external_fragmentation": 0,
            "free": k * self.num_slots - allocated,
        }


def _ceil_sum(m: int, bs: int) -> int:
    """sum(ceil(x / bs) for x in 1..m) in O(1): with m = q * bs + r it is bs * q(q+1)/2 + r(q+1)."""
    q, r = divmod(m, bs)
    return bs * q * (q + 1) // 2 + r * (q + 1)
