"""The contiguous KV allocator of the systems before vLLM (Orca, FasterTransformer).

The pool is one flat arena of ``num_blocks * block_size`` token slots — the same bytes as the paged
pool. Each request, when admitted, reserves one contiguous range of slots big enough for the longest
it may become; the range never moves and never grows, and is freed when the request finishes or is
preempted. This is what wastes memory in three ways (PagedAttention paper §3, Figure 2):

- reserved: slots kept for tokens the request will still produce (useful later, idle now);
- internal fragmentation: slots beyond the request's final length, never used;
- external fragmentation: free gaps between ranges too small for the next request.

How much a request reserves is the *reservation policy* of the paper's Orca baselines (§6.1):
``max`` reserves ``max_model_len`` slots (Orca Max); ``pow2`` its prompt plus the next power of two
>= its output length, capped at ``max_model_len`` (Orca Pow2: "over-reserves the space for outputs
by at most 2x: if the true output length is 25, it reserves 32 positions"); ``oracle`` exactly its
final length (Orca Oracle, which knows the future). ``pow2-total`` is a variant of ours, kept for
comparison: the next power of two of prompt + output (it over-reserves the prompt too).

Where the range goes is the *placement*: ``first-fit`` or ``best-fit`` over a list of free gaps
that merge at once with their neighbours (an idealised allocator), or ``buddy`` (the paper's
assumption for Orca, ``engine/baselines/buddy.py``): the range is the start of a power-of-two chunk, and the
chunk's rounding (chunk - reservation slots) is counted as external fragmentation — memory lost to
the allocator, the paper's "external fragmentation and others" (Figure 2).

Such an allocator cannot share (PagedAttention paper §4.4 is what it lacks): for parallel sampling
and beam search it gives every sequence of a group its own range — the n ranges are reserved when
the group is admitted — and a forked sequence gets the parent's prompt KV *copied* into its range
(``blocks_to_copy`` in 1-slot blocks), as the systems before vLLM did.

Attention reads the arena as ``num_slots`` blocks of one slot each (``attention_block_size = 1``):
a request's block table is the run of slot numbers of its tokens, so the paged attention code reads
contiguous memory unchanged.
"""

from __future__ import annotations

import bisect

from engine.config import PLACEMENTS, RESERVATIONS
from engine.core.accounting import MemoryUsage
from engine.core.kv_cache_manager import Group, KVCacheManager
from engine.baselines.buddy import BuddyArena, chunk_size
from engine.core.events import EventLog
from engine.report import ALLOCATE, FORK, FREE, BlockTableSnapshot
from engine.core.sequence import Sequence



class ContiguousAllocator(KVCacheManager):
    """One contiguous range of slots per request, placed in a flat arena.

    Free memory is a sorted list of gaps ``[start, end)``; a new range is cut from the first gap
    that is large enough (first-fit) or the smallest such gap (best-fit), and a freed range is
    merged with the gaps on either side, so two gaps are never adjacent.

    Args:
        num_blocks: blocks of the pool it replaces; the arena has ``num_blocks * block_size`` slots.
        block_size: slots per block, only to show the arena as the paged pool's blocks.
        reservation: "max", "pow2", "pow2-total" or "oracle" (see the module docstring).
        placement: "first-fit", "best-fit" or "buddy".
        max_model_len: longest request in tokens; what "max" reserves and "pow2" is capped at.
        events: the log its block events go to (``engine/core/events.py``); None = a log of its own.

    Raises:
        ValueError: on a non-positive size or an unknown policy.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        reservation: str = "max",
        placement: str = "first-fit",
        max_model_len: int = 2048,
        events: EventLog | None = None,
    ):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size), ("max_model_len", max_model_len)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if reservation not in RESERVATIONS:
            raise ValueError(f"reservation must be one of {', '.join(RESERVATIONS)}; got {reservation!r}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}; got {placement!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.attention_block_size = 1
        self.reservation = reservation
        self.placement = placement
        self.max_model_len = max_model_len
        self.events = events if events is not None else EventLog()
        # Free gaps, sorted by start: gap_starts[i] .. gap_ends[i] (end exclusive), never adjacent.
        self.gap_starts: list[int] = [0]
        self.gap_ends: list[int] = [self.num_slots]
        self.ranges: dict[int, tuple[int, int]] = {}  # seq_id -> [start, end) of its slots
        self.spare: dict[int, list[tuple[int, int]]] = {}  # request_id -> ranges kept for its forks
        self.pending_copies: list[tuple[int, int]] = []  # forks' prompt copies, (src slot, dst slot)
        self.buddy = BuddyArena(self.num_slots) if placement == "buddy" else None
        self.rounding = 0  # buddy: slots of all live chunks beyond their ranges

    # --- Reservation and placement -----------------------------------------------------------------

    def reservation_size(self, seq: Sequence) -> int:
        """Slots ``seq`` reserves when admitted (paper §6.1's Orca Max / Pow2 / Oracle)."""
        if self.reservation == "max":
            return self.max_model_len
        if self.reservation == "pow2":
            output_len = seq.max_len - seq.num_prompt_tokens
            return min(seq.num_prompt_tokens + chunk_size(max(output_len, 1)), self.max_model_len)
        if self.reservation == "pow2-total":
            return min(chunk_size(seq.max_len), self.max_model_len)
        return seq.max_len

    def _find_gap(self, size: int) -> int | None:
        """Index of the gap the placement policy picks for ``size`` slots, or None if none fits."""
        fits = [i for i, (s, e) in enumerate(zip(self.gap_starts, self.gap_ends)) if e - s >= size]
        if not fits:
            return None
        if self.placement == "first-fit":
            return fits[0]
        return min(fits, key=lambda i: self.gap_ends[i] - self.gap_starts[i])

    # --- KVCacheManager ----------------------------------------------------------------------------

    def free_pieces(self) -> list[tuple[int, int]]:
        """Free memory as sorted ``(start, end)`` pieces (gaps, or the buddy arena's free chunks)."""
        if self.buddy is not None:
            return self.buddy.free_pieces()
        return list(zip(self.gap_starts, self.gap_ends))

    def fits_ever(self, seq: Group) -> bool:
        size, count = self.reservation_size(seq.seqs[0]), self._ranges_needed(seq)
        if self.buddy is not None:
            chunk = chunk_size(size)
            return chunk <= self.buddy.largest_chunk and count * chunk <= self.num_slots
        return count * size <= self.num_slots

    def can_allocate(self, seq: Group, num_new_tokens: int | None = None, computed_blocks: list[int] | None = None) -> bool:
        # The whole range is reserved at admission, chunked prefill or not: num_new_tokens changes nothing.
        size, count = self.reservation_size(seq.seqs[0]), self._ranges_needed(seq)
        if self.buddy is not None:  # an aligned free chunk of 2^k holds 2^k / chunk chunks
            if count == 1:
                return self.buddy.can_allocate(size)
            return sum((e - s) // chunk_size(size) for s, e in self.buddy.free_pieces()) >= count
        if count == 1:
            return any(e - s >= size for s, e in zip(self.gap_starts, self.gap_ends))
        return sum((e - s) // size for s, e in zip(self.gap_starts, self.gap_ends)) >= count

    def allocate(self, seq: Group, num_new_tokens: int | None = None, computed_blocks: list[int] | None = None) -> None:
        for s in seq.unfinished_seqs():
            assert s.seq_id not in self.ranges, f"sequence {s.seq_id} already holds a range"
            self.ranges[s.seq_id] = self._take_range(s)
        first = seq.seqs[0]
        spare = self._ranges_needed(seq) - len(seq.unfinished_seqs())
        if spare > 0:  # a group's first prefill: keep ranges for the sequences it will fork
            self.spare[seq.request_id] = [self._take_range(first) for _ in range(spare)]

    def fork(self, parent: Sequence, child: Sequence) -> None:
        spare = self.spare.get(parent.request_id)
        self.ranges[child.seq_id] = spare.pop() if spare else self._take_range(child)
        src, dst = self.ranges[parent.seq_id][0], self.ranges[child.seq_id][0]
        self.pending_copies += [(src + i, dst + i) for i in range(parent.num_computed_tokens)]
        self.events.emit(FORK, child.request_id, seq_id=child.seq_id, parent_seq_id=parent.seq_id,
                         detail=f"{parent.num_computed_tokens} slots copied")

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def free_group(self, group: Group) -> None:
        for start, end in self.spare.pop(group.request_id, []):
            self._free_range(start, end)

    def _ranges_needed(self, group: Group) -> int:
        return group.num_samples

    def _take_range(self, seq: Sequence) -> tuple[int, int]:
        size = self.reservation_size(seq)
        if self.buddy is not None:
            start = self.buddy.allocate(size)
            assert start is not None, f"no free chunk for {size} slots (the scheduler checks can_allocate first)"
            self.rounding += chunk_size(size) - size
            self._event(ALLOCATE, seq, start, start + size)
            return start, start + size
        i = self._find_gap(size)
        assert i is not None, f"no gap of {size} slots (the scheduler checks can_allocate first)"
        start = self.gap_starts[i]
        if self.gap_ends[i] - start == size:
            del self.gap_starts[i], self.gap_ends[i]
        else:
            self.gap_starts[i] = start + size
        self._event(ALLOCATE, seq, start, start + size)
        return start, start + size

    def can_allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        start, end = self.ranges[seq.seq_id]
        return seq.num_computed_tokens + num_new_tokens <= end - start

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        # A prompt's later chunks land in the range reserved for the whole request at admission.
        assert self.can_allocate_slots(seq, num_new_tokens), f"request {seq.request_id} outgrew its reserved range"

    def can_append_slot(self, seq: Sequence) -> bool:
        start, end = self.ranges[seq.seq_id]
        return seq.num_tokens <= end - start

    def append_slot(self, seq: Sequence) -> None:
        # The range was reserved for the whole request up front: nothing to allocate.
        assert self.can_append_slot(seq), f"request {seq.request_id} outgrew its reserved range"

    def free(self, seq: Sequence) -> None:
        start, end = self.ranges.pop(seq.seq_id)
        self._event(FREE, seq, start, end)
        self._free_range(start, end)

    def _free_range(self, start: int, end: int) -> None:
        if self.buddy is not None:
            self.buddy.free(start, end - start)
            self.rounding -= chunk_size(end - start) - (end - start)
            return
        i = bisect.bisect_left(self.gap_starts, start)
        # Merge with the gap just after and the gap just before, so gaps stay maximal.
        if i < len(self.gap_starts) and self.gap_starts[i] == end:
            end = self.gap_ends[i]
            del self.gap_starts[i], self.gap_ends[i]
        if i > 0 and self.gap_ends[i - 1] == start:
            self.gap_ends[i - 1] = end
        else:
            self.gap_starts.insert(i, start)
            self.gap_ends.insert(i, end)

    def slot_mapping(self, seq: Sequence, start: int, end: int) -> list[int]:
        base = self.ranges[seq.seq_id][0]
        return list(range(base + start, base + end))

    def attention_block_table(self, seq: Sequence) -> list[int]:
        base = self.ranges[seq.seq_id][0]
        return list(range(base, base + seq.num_tokens))

    def usage(self, running: list[Group], next_waiting: Group | None, bytes_per_slot: int = 0) -> MemoryUsage:
        token_states = reserved = internal = 0
        for group in running:
            for seq in group.unfinished_seqs():
                start, end = self.ranges[seq.seq_id]
                token_states += seq.num_computed_tokens
                reserved += seq.max_len - seq.num_computed_tokens
                internal += end - start - seq.max_len
            for start, end in self.spare.get(group.request_id, []):  # set aside for a fork's copy
                reserved += min(end - start, group.seqs[0].max_len)
                internal += max(0, end - start - group.seqs[0].max_len)
        external = self.external_fragmentation(next_waiting)
        return MemoryUsage(
            capacity=self.num_slots,
            token_states=token_states,
            reserved=reserved,
            internal_fragmentation=internal,
            external_fragmentation=external,
            free=self.num_slots - token_states - reserved - internal - external,
            bytes_per_slot=bytes_per_slot,
        )

    def external_fragmentation(self, next_waiting: Group | None) -> int:
        """Free slots in gaps too small for ``next_waiting``'s reservation (0 when nothing waits),
        plus, for buddy placement, the rounding of every live chunk (slots no request can use)."""
        if next_waiting is None:
            return self.rounding
        size = self.reservation_size(next_waiting.seqs[0])
        if self.buddy is not None:
            return self.rounding + self.buddy.free_slots_below(size)
        return sum(e - s for s, e in zip(self.gap_starts, self.gap_ends) if e - s < size)

    def snapshot(self, running: list[Group]) -> list[BlockTableSnapshot]:
        bs, snaps = self.block_size, []
        for seq in (s for g in running for s in g.unfinished_seqs()):
            start, end = self.ranges[seq.seq_id]
            filled_end = start + seq.num_computed_tokens
            blocks = list(range(start // bs, -(-end // bs)))
            filled = [max(0, min(filled_end, (b + 1) * bs) - max(start, b * bs)) for b in blocks]
            snaps.append(BlockTableSnapshot(seq.request_id, blocks, filled, slot_range=(start, end), seq_id=seq.seq_id,
                                            index=seq.index, ref_counts=[1] * len(blocks)))
        return snaps

    def _event(self, kind: str, seq: Sequence, start: int, end: int) -> None:
        if self.events.enabled:  # the simulator's null log: no text to format
            self.events.emit(kind, seq.request_id, block_id=start // self.block_size, logical_index=0, detail=f"slots {start}..{end - 1}")
