"""Lab append_slot: a new block only when the new token's position is past the last block."""

from engine.core.block_manager import PagedBlockManager
from engine.core.sequence import Sequence

from labkit import request


def prefilled(kv: PagedBlockManager, n: int) -> Sequence:
    group = request(0, n)
    kv.allocate(group)
    seq = group.seqs[0]
    seq.num_computed_tokens = n
    return seq


def test_no_new_block_inside_the_last_block():
    kv = PagedBlockManager(8, 4, watermark=0.0)
    seq = prefilled(kv, 5)
    seq.append_token(1)  # position 5, inside block 1
    assert kv.append_slot(seq) is None
    assert len(seq.block_table) == 2, "position 5 lies in the second block: no new block"


def test_a_new_block_when_the_last_one_is_full():
    kv = PagedBlockManager(8, 4, watermark=0.0)
    seq = prefilled(kv, 4)
    free = kv.num_free_blocks
    seq.append_token(1)  # position 4: past the only block
    assert kv.append_slot(seq) is None, "a fresh block needs no copy: return None"
    assert len(seq.block_table) == 2 and kv.num_free_blocks == free - 1, "position 4 needs a second block, taken from the pool"


def test_internal_fragmentation_stays_under_one_block():
    kv = PagedBlockManager(32, 4, watermark=0.0)
    seq = prefilled(kv, 1)
    for _ in range(40):
        seq.append_token(1)
        kv.append_slot(seq)
        waste = len(seq.block_table) * kv.block_size - seq.num_tokens
        assert 0 <= waste < kv.block_size, f"{seq.num_tokens} tokens hold {len(seq.block_table)} blocks: a block taken ahead of time"
        seq.num_computed_tokens = seq.num_tokens
