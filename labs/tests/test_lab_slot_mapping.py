"""Lab slot_mapping: blocks for n tokens, growing a block table, slot = block * block_size + offset."""

from engine.core.block_manager import PagedBlockManager
from engine.core.sequence import Sequence

from labkit import request, scheduler, step


def test_blocks_needed_is_a_ceiling():
    kv = PagedBlockManager(8, 4, watermark=0.0)
    got = [kv.blocks_needed(n) for n in (0, 1, 3, 4, 5, 8, 9)]
    assert got == [0, 1, 1, 1, 2, 2, 3], f"blocks_needed(n) = ceil(n / block_size); got {got} for n = 0, 1, 3, 4, 5, 8, 9"


def test_slot_mapping_of_a_prefill_and_a_decode():
    kv = PagedBlockManager(8, 4, watermark=0.0)
    seq = Sequence(0, 10, 20, block_table=[7, 2, 5])
    assert kv.slot_mapping(seq, 0, 10) == [28, 29, 30, 31, 8, 9, 10, 11, 20, 21], \
        "slot of position pos = block_table[pos // block_size] * block_size + pos % block_size"
    assert kv.slot_mapping(seq, 10, 11) == [22], "a decode maps one position, the newest"
    assert kv.slot_mapping(seq, 3, 3) == [], "an empty range maps nothing"


def test_allocate_slots_grows_the_table_only_as_needed():
    kv = PagedBlockManager(8, 4, watermark=0.0)
    seq = Sequence(0, 12, 20)
    kv.allocate_slots(seq, 5)
    assert len(seq.block_table) == 2, "5 tokens from position 0 take 2 blocks of 4"
    seq.num_computed_tokens = 5
    kv.allocate_slots(seq, 3)
    assert len(seq.block_table) == 2, "positions 5..7 fit the second block: no new block"
    seq.num_computed_tokens = 8
    kv.allocate_slots(seq, 4)
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3, "positions 8..11 take a third, distinct block"


def test_the_engine_maps_every_token_to_its_own_slot():
    sched = scheduler(num_blocks=16, block_size=4, max_num_batched_tokens=64)
    groups = [request(i, n) for i, n in enumerate((5, 9, 3))]
    for g in groups:
        sched.add(g)
    seen = {}
    for _ in range(6):
        out = sched.schedule()
        for seq in out.prefill_seqs + out.decode_seqs:
            n = out.num_tokens_of(seq)
            start = seq.num_computed_tokens
            for pos, slot in zip(range(start, start + n), sched.kv.slot_mapping(seq, start, start + n)):
                assert seen.setdefault(slot, (seq.seq_id, pos)) == (seq.seq_id, pos), \
                    f"slot {slot} given to two tokens: {seen[slot]} and {(seq.seq_id, pos)}"
                assert slot // 4 == seq.block_table[pos // 4], f"position {pos} must land in its own block {seq.block_table[pos // 4]}"
        for seq in sched.update_from_output(out):
            seq.append_token(7)
