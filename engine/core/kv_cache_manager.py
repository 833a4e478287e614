"""What the scheduler asks of a KV allocator: the ``KVCacheManager`` interface (vLLM's block space
manager). Two allocators implement it: the paged one (``engine/core/block_manager.py``) and the
contiguous one of the systems before vLLM (``engine/baselines/contiguous.py``), so the same scheduler,
in the engine and in the model-free simulator, runs on either."""

from __future__ import annotations

from abc import ABC, abstractmethod

from engine.core.accounting import MemoryUsage
from engine.core.sequence import Sequence, SequenceGroup
from engine.core.events import EventLog
from engine.report import BlockTableSnapshot

# What the scheduler hands an allocator: a request, as its sequence group. (The simulator's lock-step
# path hands a bare Sequence, which answers the same interface: engine/core/sequence.py.)
Group = SequenceGroup


class KVCacheManager(ABC):
    """What the scheduler asks of a KV allocator (vLLM's block space manager).

    Attributes every implementation sets:
        block_size: slots per block, as the pool is shown and stored.
        num_blocks: blocks in the pool; capacity is ``num_blocks * block_size`` slots.
        attention_block_size: block size of the block tables handed to attention
            (paged: block_size; contiguous: 1, a range is a run of consecutive 1-slot blocks).
        events: the :class:`~engine.core.events.EventLog` its block events (ALLOCATE, FREE, ...) go
            to: the engine's, drained every step; the simulator's keeps nothing.
    """

    block_size: int
    num_blocks: int
    attention_block_size: int
    events: EventLog
    enable_caching: bool = False  # automatic prefix caching (the paged allocator can)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @abstractmethod
    def fits_ever(self, seq: Group) -> bool:
        """Could request ``seq`` be admitted to an empty pool and run to the end? (False: reject it,
        it would wait forever.)"""

    def get_computed_blocks(self, group: Group) -> tuple[list[int], int]:
        """Prefix caching: the cached blocks that hold the leading full blocks of a waiting
        request's prompt, and the tokens they hold (vLLM v1's ``get_computed_blocks``). The
        scheduler asks once per admission and passes the blocks to :meth:`can_allocate`,
        :meth:`allocate` and :meth:`num_prefill_tokens`. ``([], 0)`` without prefix caching."""
        return [], 0

    @abstractmethod
    def can_allocate(self, seq: Group, num_new_tokens: int | None = None, computed_blocks: list[int] | None = None) -> bool:
        """Is there room now to admit ``seq`` with its ``num_tokens`` tokens (a group: all its
        unfinished sequences; ``num_new_tokens``, ``computed_blocks``: see :meth:`allocate`)?"""

    @abstractmethod
    def allocate(self, seq: Group, num_new_tokens: int | None = None, computed_blocks: list[int] | None = None) -> None:
        """Give ``seq`` room for its ``num_tokens`` tokens (prefill, or recompute after preemption);
        with ``num_new_tokens`` (chunked prefill, one-sequence requests), room only for the tokens
        found cached and the first ``num_new_tokens`` of the rest. ``computed_blocks``: the hit of
        :meth:`get_computed_blocks`, put first in the block table (None: looked up here)."""

    def can_allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Chunked prefill: room for ``seq``'s next ``num_new_tokens`` tokens, after its
        ``num_computed_tokens``? (vLLM v1's ``allocate_slots`` answering None when it cannot.)"""
        raise NotImplementedError(f"{type(self).__name__} cannot chunk prefills")

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        """Chunked prefill: room for ``seq``'s next ``num_new_tokens`` tokens (check first)."""
        raise NotImplementedError(f"{type(self).__name__} cannot chunk prefills")

    @abstractmethod
    def can_append_slot(self, seq: Sequence) -> bool:
        """Is there room for the token at position ``seq.num_tokens - 1``?"""

    @abstractmethod
    def append_slot(self, seq: Sequence) -> tuple[int, int] | None:
        """Make room for the token at position ``seq.num_tokens - 1`` (decode). Returns the
        copy-on-write pair ``(src, dst)`` (in attention blocks) when that slot lay in a shared
        block, which must be copied before the step's forward pass; else None."""

    @abstractmethod
    def free(self, seq: Sequence) -> None:
        """Release everything ``seq`` holds (finish, abort or preemption)."""

    def allocate_lookahead_slots(self, seq: Sequence, num_lookahead: int) -> int:
        """Speculative decoding: tentative slots for up to ``num_lookahead`` draft tokens after
        ``seq``'s newest token (vLLM v1's ``allocate_slots(num_lookahead_tokens=k)``); returns how
        many it got. Paged only (``engine/core/block_manager.py``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot hold lookahead slots (speculative decoding needs the paged allocator)")

    def rollback_lookahead(self, seq: Sequence) -> tuple[list[int], list[int]]:
        """Speculative decoding, after verification: give back the rejected drafts' slots and free
        the blocks left with no verified token; returns (rolled-back slots, freed block ids)."""
        raise NotImplementedError(f"{type(self).__name__} cannot hold lookahead slots (speculative decoding needs the paged allocator)")

    def can_append_slots(self, group: Group) -> bool:
        """Room for every unfinished sequence of ``group`` to decode one token this step?"""
        return all(self.can_append_slot(s) for s in group.unfinished_seqs())

    def num_prefill_tokens(self, group: Group, computed_blocks: list[int] | None = None) -> int:
        """Tokens a (re)prefill of ``group`` computes (a shared prompt counted once where shared,
        the tokens of ``computed_blocks`` not at all)."""
        return group.num_new_tokens

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Give ``child`` what ``parent`` holds (paged: the same blocks, refcounts + 1;
        contiguous: a range of its own, with the parent's KV queued in ``pending_copies``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot fork sequences")

    def cache_blocks(self, seqs: list[Sequence]) -> None:
        """After a step's forward pass (every ``seq.num_computed_tokens`` up to date): cache the
        blocks it filled (prefix caching; nothing without it)."""

    def free_group(self, group: Group) -> None:
        """Release what ``group`` holds beyond its sequences' own memory (contiguous: ranges kept
        for its forks); called when the group finishes or is preempted."""

    def free_queue(self) -> list[int]:
        """Free blocks in the order they will be handed out (paged only; a contiguous arena has gaps)."""
        return []

    def cached_free_hashes(self) -> dict[int, str]:
        """Free blocks that still hold cached KV -> their block hash (hex); prefix caching only."""
        return {}

    def take_offload_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The prefix cache's CPU-tier copies queued since the last step (``engine/core/kv_offload.py``):
        ``(gpu, cpu)`` offloads and ``(cpu, gpu)`` loads; none without a tier."""
        return [], []

    def discard_offload_copies(self, copies_out: list[tuple[int, int]], copies_in: list[tuple[int, int]]) -> None:
        """A step failed before the CPU-tier copies of :meth:`take_offload_copies` ran: forget them."""

    def offload_stats(self):
        """The step's :class:`~engine.core.kv_offload.KVOffloadStats` (None without a CPU tier)."""
        return None

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """Copies (in attention blocks) that forks queued since the last step, to run before the
        next forward pass; the paged allocator shares instead and queues none."""
        return []

    num_kv_cache_groups = 1  # a hybrid model's coordinator has several (engine/core/kv_cache_coordinator.py)

    def group_slot_mapping(self, seq: Sequence, start: int, end: int, group_id: int) -> list[int]:
        """KV cache group ``group_id``'s slot of each position in ``[start, end)``; one group: :meth:`slot_mapping`."""
        return self.slot_mapping(seq, start, end)

    def group_block_table(self, seq: Sequence, group_id: int) -> list[int]:
        """KV cache group ``group_id``'s block table; one group: :meth:`attention_block_table`."""
        return self.attention_block_table(seq)

    def kv_groups(self, running: list[Group]) -> list:
        """A hybrid model's groups after the step (``StepReport.kv_groups``); empty for one group."""
        return []

    @abstractmethod
    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Physical slot of each token position in ``[start, end)`` of ``seq``."""

    @abstractmethod
    def attention_block_table(self, seq: Sequence) -> list[int]:
        """Block ids, in units of ``attention_block_size``, that attention reads for ``seq``."""

    @abstractmethod
    def usage(self, running: list[Group], next_waiting: Group | None, bytes_per_slot: int = 0) -> MemoryUsage:
        """The pool in the paper's categories (see ``engine/core/accounting.py``)."""

    @abstractmethod
    def snapshot(self, running: list[Group]) -> list[BlockTableSnapshot]:
        """Every live sequence's block table with the filled slots of each block, grouped by request."""
