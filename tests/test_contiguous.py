"""The contiguous allocator (engine/baselines/contiguous.py) and the accounting of both allocators, worked by hand.

Drawings show the arena slot by slot: T = token state, R = reserved, I = internal fragmentation,
E = external fragmentation, . = free; | separates blocks (block_size 4).
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.block_manager import PagedBlockManager
from engine.baselines.buddy import BuddyArena
from engine.baselines.contiguous import ContiguousAllocator
from engine.report import ALLOCATE, FREE
from engine.core.scheduler import Scheduler
from engine.core.sequence import Sequence


def seq(request_id, prompt, max_len, computed=0):
    s = Sequence(request_id, num_prompt_tokens=prompt, max_len=max_len)
    s.num_computed_tokens = computed
    return s


def categories(usage):
    return (usage.token_states, usage.reserved, usage.internal_fragmentation, usage.external_fragmentation, usage.free)


def test_max_reservation_accounting():
    """Orca Max, max_model_len 8, arena 16 slots. A: 3 tokens computed, final length 5;
    B: 2 computed, final length 4. Each reserves 8 slots.

        slot  0 1 2 3 | 4 5 6 7 | 8 9 10 11 | 12 13 14 15
        A     T T T R   R I I I
        B                         T T R  R    I  I  I  I

    token states 3+2 = 5, reserved 2+2 = 4, internal (8-5)+(8-4) = 7, external 0, free 0.
    """
    kv = ContiguousAllocator(num_blocks=4, block_size=4, reservation="max", max_model_len=8)
    a, b = seq(0, 3, 5), seq(1, 2, 4)
    kv.allocate(a)
    kv.allocate(b)
    a.num_computed_tokens, b.num_computed_tokens = 3, 2
    assert kv.ranges == {0: (0, 8), 1: (8, 16)}
    assert categories(kv.usage([a, b], None)) == (5, 4, 7, 0, 0)
    assert not kv.can_allocate(seq(2, 1, 2))


@pytest.mark.parametrize("policy, sizes", [
    ("max", (64, 64, 64, 64)), ("pow2", (42, 7, 18, 64)), ("pow2-total", (64, 8, 16, 64)), ("oracle", (35, 7, 11, 60))])
def test_reservation_sizes(policy, sizes):
    """(prompt, final length) = (10, 35), (3, 7), (2, 11), (40, 60) with max_model_len 64. Max
    reserves 64 each. Pow2 (paper §6.1) keeps the prompt and rounds the output up to a power of two:
    10 + 32 (the paper's "output 25 -> 32 positions"), 3 + 4, 2 + 16, 40 + 32 capped at 64.
    pow2-total rounds prompt + output (64, 8, 16, 64); Oracle reserves the final length."""
    kv = ContiguousAllocator(num_blocks=16, block_size=4, reservation=policy, max_model_len=64)
    shapes = ((10, 35), (3, 7), (2, 11), (40, 60))
    assert tuple(kv.reservation_size(seq(i, p, n)) for i, (p, n) in enumerate(shapes)) == sizes


def test_pow2_accounting():
    """Orca Pow2, arena 16 slots. A: prompt 2, final length 5 (output 3 → 4 positions), so it
    reserves 2 + 4 = 6; 2 tokens computed.

        slot  0 1 2 3 | 4 5 6 7 | 8 9 10 11 | 12 13 14 15
        A     T T R R   R I . .   .  .  .  .    .  .  .  .

    token states 2, reserved 3, internal 1, free 10.
    """
    kv = ContiguousAllocator(num_blocks=4, block_size=4, reservation="pow2", max_model_len=16)
    a = seq(0, 2, 5)
    kv.allocate(a)
    a.num_computed_tokens = 2
    assert categories(kv.usage([a], None)) == (2, 3, 1, 0, 10)


def test_external_fragmentation_a_request_waits_although_slots_are_free():
    """Orca Oracle, arena 16 slots. A (6), B (4), C (6) are admitted and fill the arena; A and C
    finish. D (final length 8) waits: 12 slots are free, but in two gaps of 6.

        slot  0 1 2 3 | 4 5 6 7 | 8 9 10 11 | 12 13 14 15
        B                 T T R R
        gaps  E E E E   E E         E  E    E  E  E  E     (D needs 8 contiguous)

    token states 2, reserved 2, external 12, free 0.
    """
    kv = ContiguousAllocator(num_blocks=4, block_size=4, reservation="oracle", max_model_len=16)
    sched = Scheduler(kv, max_num_seqs=8, max_num_batched_tokens=64)
    a, b, c = seq(0, 3, 6), seq(1, 2, 4), seq(2, 3, 6)
    for s in (a, b, c):
        sched.add(s)
    out = sched.schedule()
    assert out.prefill_seqs == [a, b, c]
    for s in out.prefill_seqs:
        s.num_computed_tokens = s.num_tokens
    sched.finish(a, "length")
    sched.finish(c, "length")
    d = seq(3, 4, 8)
    sched.add(d)
    out = sched.schedule()
    assert d in sched.waiting and d not in out.prefill_seqs
    assert kv.num_slots - sum(e - s for s, e in kv.ranges.values()) == 12 >= kv.reservation_size(d)
    b.num_computed_tokens = 2
    assert categories(kv.usage([b], d)) == (2, 2, 0, 12, 0)
    assert categories(kv.usage([b], None)) == (2, 2, 0, 0, 12)


def test_paged_accounting():
    """Paged, 4 blocks of 4. A: 5 tokens computed in 2 blocks; B: 4 tokens in 1 block.

        block 0: A T T T T | block 1: A T I I I | block 2: B T T T T | block 3: . . . .

    token states 9, internal 3 (A's tail), reserved 0, external 0, free 4.
    """
    kv = PagedBlockManager(num_blocks=4, block_size=4)
    a, b = seq(0, 5, 9), seq(1, 4, 9)
    kv.allocate(a)
    kv.allocate(b)
    a.num_computed_tokens, b.num_computed_tokens = 5, 4
    assert categories(kv.usage([a, b], seq(2, 16, 20))) == (9, 0, 3, 0, 4)


def test_free_merges_neighbouring_gaps():
    kv = ContiguousAllocator(num_blocks=4, block_size=4, reservation="oracle", max_model_len=16)
    seqs = [seq(i, 1, 4) for i in range(4)]
    for s in seqs:
        kv.allocate(s)
    assert kv.gap_starts == []
    kv.free(seqs[1])
    kv.free(seqs[3])
    assert list(zip(kv.gap_starts, kv.gap_ends)) == [(4, 8), (12, 16)]
    kv.free(seqs[2])  # joins both neighbours
    assert list(zip(kv.gap_starts, kv.gap_ends)) == [(4, 16)]
    kv.free(seqs[0])
    assert list(zip(kv.gap_starts, kv.gap_ends)) == [(0, 16)]


def test_first_fit_and_best_fit():
    """Gaps of 6 slots at 0 and 4 slots at 10; a 4-slot request goes to 0 (first-fit) or 10 (best-fit)."""
    for placement, expected in (("first-fit", 0), ("best-fit", 10)):
        kv = ContiguousAllocator(num_blocks=4, block_size=4, reservation="oracle", placement=placement, max_model_len=16)
        a, b, c, d = seq(0, 1, 6), seq(1, 1, 4), seq(2, 1, 4), seq(4, 1, 2)
        for s in (a, b, c, d):
            kv.allocate(s)
        kv.free(a)
        kv.free(c)
        d = seq(3, 1, 4)
        kv.allocate(d)
        assert kv.ranges[3][0] == expected


def test_attention_view_snapshot_and_events():
    kv = ContiguousAllocator(num_blocks=4, block_size=4, reservation="oracle", max_model_len=16)
    kv.allocate(seq(0, 1, 3))
    a = seq(1, 3, 6)
    kv.allocate(a)  # slots 3..8
    assert kv.attention_block_size == 1
    assert kv.attention_block_table(a) == [3, 4, 5]
    assert kv.slot_mapping(a, 1, 3) == [4, 5]
    a.num_computed_tokens = 3
    snap = kv.snapshot([a])[0]
    assert (snap.block_table, snap.filled, snap.slot_range) == ([0, 1, 2], [1, 2, 0], (3, 9))
    kv.free(a)
    assert [(e.kind, e.request_id, e.block_id, e.detail) for e in list(kv.events)[1:]] == [
        (ALLOCATE, 1, 0, "slots 3..8"), (FREE, 1, 0, "slots 3..8")]


def test_fits_ever_and_bad_arguments():
    kv = ContiguousAllocator(num_blocks=2, block_size=4, reservation="oracle", max_model_len=16)
    assert kv.fits_ever(seq(0, 1, 8)) and not kv.fits_ever(seq(1, 1, 9))
    assert not ContiguousAllocator(2, 4, reservation="max", max_model_len=16).fits_ever(seq(0, 1, 2))
    with pytest.raises(ValueError, match="num_blocks"):
        ContiguousAllocator(0, 16)
    with pytest.raises(ValueError, match="reservation"):
        ContiguousAllocator(4, 16, reservation="half")
    with pytest.raises(ValueError, match="placement"):
        ContiguousAllocator(4, 16, placement="worst-fit")
    with pytest.raises(ValueError, match="num_slots"):
        BuddyArena(0)


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(["max", "pow2", "oracle"]),
    placement=st.sampled_from(["first-fit", "best-fit"]),
    ops=st.lists(st.tuples(st.booleans(), st.integers(1, 40), st.integers(0, 100)), max_size=60),
)
def test_ranges_never_overlap_and_tile_the_arena(policy, placement, ops):
    """Random admissions and departures: ranges and gaps tile the arena, gaps stay sorted and
    maximal, and the categories always sum to the capacity."""
    kv = ContiguousAllocator(num_blocks=8, block_size=8, reservation=policy, placement=placement, max_model_len=40)
    live: list[Sequence] = []
    for i, (admit, max_len, pick) in enumerate(ops):
        if admit:
            s = seq(i, 1, max_len)
            if kv.can_allocate(s):
                kv.allocate(s)
                s.num_computed_tokens = pick % max_len
                live.append(s)
        elif live:
            kv.free(live.pop(pick % len(live)))
        pieces = sorted(list(kv.ranges.values()) + list(zip(kv.gap_starts, kv.gap_ends)))
        assert pieces[0][0] == 0 and pieces[-1][1] == kv.num_slots
        assert all(p[1] == q[0] for p, q in zip(pieces, pieces[1:]))  # no overlap, no hole
        assert all(e1 < s2 for e1, s2 in zip(kv.gap_ends, kv.gap_starts[1:]))  # sorted, never adjacent
        usage = kv.usage(live, seq(-1, 1, max_len))  # MemoryUsage checks the sum itself
        assert usage.allocated == sum(e - s for s, e in kv.ranges.values())


def test_paged_and_contiguous_engines_give_identical_greedy_outputs(tiny_llama_dir):
    """The same attention code reads the contiguous arena as 1-slot blocks: greedy outputs of a real
    (tiny, random) Llama must not depend on where the K and V live."""
    from engine import EngineConfig, LLMEngine, SamplingParams

    prompts = ["The sky is", "Paged attention stores keys and values in blocks", "1 2 3"]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outputs = {}
    for allocator, reservation in (("paged", "max"), ("contiguous", "pow2"), ("contiguous", "oracle")):
        engine = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=32, block_size=16, max_model_len=128,
                                        allocator=allocator, reservation=reservation, device="cpu"))
        ids = [engine.add_request(p, params) for p in prompts]
        while engine.has_unfinished_requests():
            engine.step()
        outputs[allocator, reservation] = [engine.get_output(i).token_ids for i in ids]
    assert all(len(o) == 12 for o in outputs["paged", "max"])
    assert outputs["paged", "max"] == outputs["contiguous", "pow2"] == outputs["contiguous", "oracle"]
