"""Buddy placement (engine/baselines/buddy.py, ContiguousAllocator(placement="buddy")), worked by hand.

Drawings show a 16-slot arena slot by slot: a letter is a request's slot, r its chunk's rounding
(allocated, never usable), . a free slot; [ ] brackets one chunk, free or allocated.
"""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.baselines.buddy import BuddyArena, chunk_size
from engine.baselines.contiguous import ContiguousAllocator
from engine.core.sequence import Sequence


def seq(request_id, prompt, max_len, computed=0):
    s = Sequence(request_id, num_prompt_tokens=prompt, max_len=max_len)
    s.num_computed_tokens = computed
    return s


def test_chunk_sizes_are_powers_of_two():
    assert [chunk_size(n) for n in (1, 2, 3, 4, 5, 8, 9, 25, 2048)] == [1, 2, 4, 4, 8, 8, 16, 32, 2048]


def test_allocation_splits_the_smallest_chunk_that_fits():
    """A asks for 3 slots: its chunk is 4. The 16-slot root splits into buddies 8 + 8, the lower 8
    into 4 + 4, and A takes the lowest 4.

        slot    0 1 2 3  4 5 6 7  8 9 ...    15
        before [                 .                 ]   one free chunk of 16
        after  [A A A r][ . . . ][ .  .  .  .  .  ]   A's chunk, free 4 at 4, free 8 at 8

    B asks for 2: the free 4 at 4 is split (not the 8), B takes [4, 6) and [6, 8) stays free.
    """
    arena = BuddyArena(16)
    assert arena.allocate(3) == 0
    assert arena.free_pieces() == [(4, 8), (8, 16)]
    assert arena.allocate(2) == 4
    assert arena.free_pieces() == [(6, 8), (8, 16)]


def test_free_merges_with_its_buddy_up_the_tree():
    """A = [0, 4), B = [4, 6). Freeing B: its buddy (4 XOR 2 = 6) is free, so [4, 8) forms again;
    that chunk's buddy (4 XOR 4 = 0) is A, busy, so merging stops. Freeing A then merges
    [0, 4) + [4, 8) = [0, 8), and [0, 8) + [8, 16) = the whole arena.

        after B freed  [A A A r][ . . . ][ .  .  .  .  .  ]
        after A freed  [                 .                 ]
    """
    arena = BuddyArena(16)
    a, b = arena.allocate(3), arena.allocate(2)
    arena.free(b, 2)
    assert arena.free_pieces() == [(4, 8), (8, 16)]
    arena.free(a, 3)
    assert arena.free_pieces() == [(0, 16)]


def test_neighbours_that_are_not_buddies_never_merge():
    """A, B, C take 4 slots each at 0, 4, 8. Freeing B and C leaves 12 free slots in a row, but
    [4, 8)'s buddy is A's [0, 4), and [8, 16)'s buddy is [0, 8): the largest free chunk is 8.

        slot  0 1 2 3  4 5 6 7  8 9 10 11 12 13 14 15
              [A A A A][ . . . ][ .  .  .  .  .  .  .  . ]
    """
    arena = BuddyArena(16)
    a, b, c = (arena.allocate(4) for _ in range(3))
    arena.free(b, 4)
    arena.free(c, 4)
    assert arena.free_pieces() == [(4, 8), (8, 16)]
    assert arena.can_allocate(8) and not arena.can_allocate(9)
    assert arena.free_slots_below(9) == 12  # every free slot is in a chunk smaller than 16


def test_external_fragmentation_first_fit_would_not_have():
    """Orca Oracle on 16 slots. A (final length 3, chunk 4), B (4) and C (4) are admitted, then B
    and C finish. D (final length 9) arrives.

    Buddy: 12 slots are free, but in chunks of 4 and 8 (they are not buddies), and D needs a chunk
    of 16: D waits. External fragmentation = A's rounding (1) + the 12 free slots = 13.

        slot  0 1 2 3  4 5 6 7  8 9 10 11 12 13 14 15
              [A A A r][ . . . ][ .  .  .  .  .  .  .  . ]     D (16) fits nowhere

    First-fit: A = [0, 3), B = [3, 7), C = [7, 11); freeing B and C leaves one gap [3, 16) of 13
    slots, and D takes [3, 12).

        slot  0 1 2  3 4 5 6 7 8 9 10 11  12 13 14 15
              A A A  D D D D D D D D  D   .  .  .  .
    """
    def run(placement):
        kv = ContiguousAllocator(num_blocks=4, block_size=4, reservation="oracle", placement=placement, max_model_len=16)
        a, b, c = seq(0, 1, 3, computed=3), seq(1, 1, 4), seq(2, 1, 4)
        for s in (a, b, c):
            kv.allocate(s)
        kv.free(b)
        kv.free(c)
        return kv, a

    d = seq(3, 1, 9)
    buddy, a = run("buddy")
    assert not buddy.can_allocate(d)
    usage = buddy.usage([a], d)
    assert (usage.token_states, usage.internal_fragmentation, usage.external_fragmentation, usage.free) == (3, 0, 13, 0)
    first_fit, _ = run("first-fit")
    assert first_fit.can_allocate(d)
    first_fit.allocate(d)
    assert first_fit.ranges[3] == (3, 12)


def test_rounding_counts_as_external_fragmentation_even_when_nothing_waits():
    """Oracle, 16 slots: A's final length 5 → chunk 8, range [0, 5), 3 slots of rounding.

        slot  0 1 2 3 4 5 6 7  8 ... 15
              [A A A A A r r r][   .   ]
    """
    kv = ContiguousAllocator(num_blocks=4, block_size=4, reservation="oracle", placement="buddy", max_model_len=16)
    a = seq(0, 2, 5, computed=2)
    kv.allocate(a)
    assert kv.ranges[0] == (0, 5)
    usage = kv.usage([a], None)
    assert (usage.token_states, usage.reserved, usage.internal_fragmentation, usage.external_fragmentation, usage.free) == (2, 3, 0, 3, 8)
    kv.free(a)
    assert kv.rounding == 0 and kv.free_pieces() == [(0, 16)]


def test_an_arena_that_is_not_a_power_of_two_is_cut_into_roots_that_never_merge():
    """12 slots = roots of 8 at 0 and 4 at 8. A chunk of 16 never fits; two freed roots stay two."""
    arena = BuddyArena(12)
    assert arena.free_pieces() == [(0, 8), (8, 12)] and arena.largest_chunk == 8
    assert not arena.can_allocate(9)
    a, b = arena.allocate(8), arena.allocate(4)
    assert (a, b) == (0, 8) and arena.allocate(1) is None
    arena.free(a, 8)
    arena.free(b, 4)
    assert arena.free_pieces() == [(0, 8), (8, 12)]
    kv = ContiguousAllocator(num_blocks=3, block_size=4, reservation="oracle", placement="buddy", max_model_len=12)
    assert kv.fits_ever(seq(0, 1, 8)) and not kv.fits_ever(seq(1, 1, 9))


@settings(max_examples=80, deadline=None)
@given(num_slots=st.integers(1, 100), ops=st.lists(st.tuples(st.booleans(), st.integers(1, 40), st.integers(0, 99)), max_size=60))
def test_chunks_tile_the_arena_aligned_and_merged(num_slots, ops):
    """Random allocations and frees: allocated and free chunks tile the arena, every chunk is
    aligned to its size, and no free chunk's buddy is free (merging is never left undone)."""
    arena = BuddyArena(num_slots)
    live: list[tuple[int, int]] = []
    for allocate, n, pick in ops:
        if allocate:
            fits = any(e - s >= chunk_size(n) for s, e in arena.free_pieces())
            assert arena.can_allocate(n) == fits
            start = arena.allocate(n)
            assert (start is not None) == fits
            if fits:
                live.append((start, n))
        elif live:
            start, n = live.pop(pick % len(live))
            arena.free(start, n)
        chunks = sorted(arena.free_pieces() + [(s, s + chunk_size(n)) for s, n in live])
        assert chunks[0][0] == 0 and chunks[-1][1] == num_slots
        assert all(p[1] == q[0] for p, q in zip(chunks, chunks[1:]))
        assert all(s % (e - s) == 0 for s, e in chunks)
        free = set(arena.free_pieces())
        assert not any((s ^ (e - s), (s ^ (e - s)) + (e - s)) in free for s, e in free)
