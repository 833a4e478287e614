"""Lab lookahead: tentative slots for draft tokens and their rollback."""

from engine.core.block_manager import PagedBlockManager

from labkit import request


def decoding(kv, n=5):
    group = request(0, n)
    kv.allocate(group)
    seq = group.seqs[0]
    seq.num_computed_tokens = n
    seq.append_token(1)
    kv.append_slot(seq)
    return seq  # num_tokens = n + 1, its newest token's slot held


def test_lookahead_slots_take_blocks_only_as_needed():
    kv = PagedBlockManager(8, 4, watermark=0.0)
    seq = decoding(kv)  # 6 tokens in 2 blocks
    assert kv.allocate_lookahead_slots(seq, 4) == 4
    assert len(seq.block_table) == 3, "positions 6..9 need a third block"
    assert kv.tentative_slots(seq) == kv.slot_mapping(seq, 6, 10)


def test_a_short_pool_grants_fewer_drafts():
    kv = PagedBlockManager(2, 4, watermark=0.0)
    seq = decoding(kv)
    assert kv.allocate_lookahead_slots(seq, 4) == 2, "no free block: only positions 6 and 7, inside the last block"
    assert len(seq.block_table) == 2


def test_rollback_frees_blocks_without_a_verified_token():
    kv = PagedBlockManager(8, 4, watermark=0.0)
    seq = decoding(kv)
    kv.allocate_lookahead_slots(seq, 4)
    third = seq.block_table[2]
    seq.num_computed_tokens = 7  # the newest token and one draft verified
    slots, freed = kv.rollback_lookahead(seq)
    assert slots == kv.slot_mapping(seq, 7, 8) + [third * 4, third * 4 + 1], "the slots of positions 7..9 are given back"
    assert freed == [third] and len(seq.block_table) == 2, "the third block holds no verified token: freed"
    assert kv.allocator.ref_counts[third] == 0
