"""Where every KV slot of the pool is, in the categories of the PagedAttention paper's Figure 2.

Each step, every slot of the pool falls in exactly one category, so they sum to the capacity:

- token states: the slot holds the K and V of a token (the only useful memory);
- reserved: the slot is set aside for a token its request will still produce
  (contiguous allocators reserve ahead; the paged allocator never does);
- internal fragmentation: the slot is inside an allocation but will never hold a token
  (paged: the unfilled tail of each request's last block; contiguous: the over-reservation
  beyond the request's final length);
- external fragmentation: a free slot that the next waiting request cannot use, because it lies in a
  free gap too small for that request's contiguous range (always 0 for paged);
- free: every other slot.

Source: Kwon et al., SOSP 2023, §3 and Figure 2.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

CATEGORIES = ("token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")


def in_use_shares(shares: dict[str, float]) -> dict[str, float]:
    """Each category's share of the memory *in use*: the pool less its free slots.

    The PagedAttention paper's Figure 2 percentages are of this kind (its bars have no free part:
    token states, reservation, internal and external fragmentation sum to 100%), so a pool share
    (``shares``, per category of ``CATEGORIES``, summing to 1) is divided by 1 - free. External
    fragmentation counts as in use, as in the paper's bars: it is memory no waiting request can use.

    Returns:
        category -> share (0..1) for every category but "free"; all 0 when the whole pool is free.
    """
    in_use = 1.0 - shares.get("free", 0.0)
    return {c: (shares.get(c, 0.0) / in_use if in_use > 1e-12 else 0.0) for c in CATEGORIES if c != "free"}


@dataclass(frozen=True)
class MemoryUsage:
    """One step's KV pool, in token slots; multiply by ``bytes_per_slot`` for bytes.

    Attributes:
        capacity: slots in the pool (num_blocks * block_size).
        token_states, reserved, internal_fragmentation, external_fragmentation, free: slots per category
            (module docstring); they sum to ``capacity``.
        bytes_per_slot: bytes of one token's K and V over all layers
            (2 * num_layers * num_kv_heads * head_dim * element size); 0 in a model-free simulation.
        shared_slots: token states (slots) in blocks that more than one sequence references (paper
            §4.4); each physical slot is counted once in every category, shared or not.
        blocks_without_sharing: blocks the live sequences would hold if none were shared (the sum
            of their block tables' lengths).
        blocks_with_sharing: physical blocks they hold (each shared block once).
        cached_free_slots: prefix caching: slots of free blocks that still hold a cached, reusable
            block's KV (cached and evictable); a part of ``free``, not a sixth category.

    Raises:
        ValueError: when the categories do not sum to the capacity or one is negative.
    """

    capacity: int
    token_states: int
    reserved: int
    internal_fragmentation: int
    external_fragmentation: int
    free: int
    bytes_per_slot: int = 0
    shared_slots: int = 0
    blocks_without_sharing: int = 0
    blocks_with_sharing: int = 0
    cached_free_slots: int = 0

    def __post_init__(self) -> None:
        parts = [getattr(self, c) for c in CATEGORIES]
        if min(parts) < 0 or sum(parts) != self.capacity:
            raise ValueError(f"memory categories {dict(zip(CATEGORIES, parts))} do not sum to capacity {self.capacity}")
        if not 0 <= self.cached_free_slots <= self.free:
            raise ValueError(f"cached free slots ({self.cached_free_slots}) must be part of the free slots ({self.free})")

    @property
    def allocated(self) -> int:
        """Slots owned by some request: token states + reserved + internal fragmentation."""
        return self.token_states + self.reserved + self.internal_fragmentation

    def fraction(self, category: str) -> float:
        """Share of the capacity in one category, 0..1."""
        return getattr(self, category) / self.capacity if self.capacity else 0.0

    @property
    def memory_saved_by_sharing(self) -> float:
        """Paper §6.3: blocks saved by sharing / blocks needed without sharing, 0..1."""
        if not self.blocks_without_sharing:
            return 0.0
        return 1 - self.blocks_with_sharing / self.blocks_without_sharing

    def bytes(self, category: str) -> int:
        return getattr(self, category) * self.bytes_per_slot

    def as_dict(self) -> dict:
        return asdict(self)


def swap_space_usage(block_tables: list[list[int]], num_computed_tokens: list[int], block_size: int, num_blocks: int,
                     num_free: int) -> MemoryUsage:
    """The CPU swap space (paper §4.5) in the same categories: the token states of the swapped
    sequences, a block their sequences share counted once; the unfilled slots of their blocks
    (internal fragmentation); and free.

    Args:
        block_tables: each swapped sequence's block table, in CPU block ids.
        num_computed_tokens: each one's tokens with K and V in those blocks, in the same order.
        block_size: slots per block; num_blocks, num_free: the CPU pool's blocks and free blocks.
    """
    fill: dict[int, int] = {}
    for table, computed in zip(block_tables, num_computed_tokens):
        for i, block_id in enumerate(table):
            fill[block_id] = max(fill.get(block_id, 0), min(block_size, max(0, computed - i * block_size)))
    total = num_blocks * block_size
    allocated = (num_blocks - num_free) * block_size
    token_states = sum(fill.values())
    return MemoryUsage(total, token_states, 0, allocated - token_states, 0, total - allocated)
