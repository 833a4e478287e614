"""Buddy allocation of a flat slot arena: the placement the paper assumes for its Orca baselines.

PagedAttention paper §6.1: "We assume Orca uses the buddy allocation algorithm to determine the
memory address to store KV cache." A buddy allocator hands out *chunks* whose size is a power of
two, aligned to their size (Knuth, TAOCP vol. 1 §2.5):

- allocate(n): round n up to the next power of two 2^k; take the lowest free chunk of order k,
  or split the smallest larger free chunk in halves (two *buddies*) until one of order k exists;
- free: a chunk at address a of size 2^k has its buddy at a XOR 2^k; when the buddy is free too
  the two merge into one chunk of order k + 1, and so on upwards.

So the arena wastes memory twice: inside each chunk (2^k - n slots, the rounding) and between
chunks (a free chunk can only serve requests up to its own size, and free neighbours that are not
buddies never merge). An arena whose size is not a power of two is cut into power-of-two *roots*,
largest first (15,696 = 8,192 + 4,096 + 2,048 + 1,024 + 256 + 64 + 16); each root is its own tree.
Roots never merge: root 2^k starts at a multiple of 2^(k+1), so its would-be buddy lies past the
end of the smaller roots after it and is never a free chunk of order k.
"""

from __future__ import annotations


def chunk_size(n: int) -> int:
    """The chunk a request of ``n`` slots (>= 1) gets: the next power of two >= n (slots)."""
    return 1 << (n - 1).bit_length()


class BuddyArena:
    """Free chunks of ``num_slots`` slots, one set of start addresses per order (size 2^order).

    Args:
        num_slots: slots in the arena (>= 1).

    Invariants: free chunks and allocated chunks tile the arena; no free chunk has its buddy free
    (merging is immediate); every chunk of order k starts at a multiple of 2^k.
    """

    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self.max_order = num_slots.bit_length() - 1
        self.free_chunks: list[set[int]] = [set() for _ in range(self.max_order + 1)]
        start = 0
        for order in range(self.max_order, -1, -1):  # the roots: num_slots in binary
            if num_slots >> order & 1:
                self.free_chunks[order].add(start)
                start += 1 << order

    @property
    def largest_chunk(self) -> int:
        """Slots of the largest root: the biggest chunk the arena can ever give."""
        return 1 << self.max_order

    def can_allocate(self, n: int) -> bool:
        order = (n - 1).bit_length()
        return any(self.free_chunks[o] for o in range(order, self.max_order + 1))

    def allocate(self, n: int) -> int | None:
        """Take a chunk of ``chunk_size(n)`` slots; its start address, or None when none is free.
        The lowest free chunk of the smallest order that fits is split (deterministic)."""
        order = (n - 1).bit_length()
        found = next((o for o in range(order, self.max_order + 1) if self.free_chunks[o]), None)
        if found is None:
            return None
        start = min(self.free_chunks[found])
        self.free_chunks[found].remove(start)
        while found > order:  # split: keep the lower half, free the upper buddy
            found -= 1
            self.free_chunks[found].add(start + (1 << found))
        return start

    def free(self, start: int, n: int) -> None:
        """Give back the chunk at ``start`` allocated for ``n`` slots, merging it with free buddies."""
        order = (n - 1).bit_length()
        while order < self.max_order:
            buddy = start ^ (1 << order)
            if buddy not in self.free_chunks[order]:
                break
            self.free_chunks[order].remove(buddy)
            start = min(start, buddy)
            order += 1
        assert start not in self.free_chunks[order], f"chunk {start} (order {order}) freed twice"
        self.free_chunks[order].add(start)

    def free_slots_below(self, n: int) -> int:
        """Free slots in chunks too small for a request of ``n`` slots (its external fragmentation)."""
        order = (n - 1).bit_length()
        return sum(len(self.free_chunks[o]) << o for o in range(min(order, self.max_order + 1)))

    def free_pieces(self) -> list[tuple[int, int]]:
        """Every free chunk as ``(start, end)`` (end exclusive), sorted by start."""
        return sorted((s, s + (1 << o)) for o, starts in enumerate(self.free_chunks) for s in starts)
