"""Lab sliding_window: a sliding-window group frees the blocks that left the window."""

from engine.core.single_type_kv_cache_manager import NULL_BLOCK, SlidingWindowManager

from labkit import request


def prefilled(window: int, num_tokens: int, block_size: int = 4, num_blocks: int = 32):
    kv = SlidingWindowManager(num_blocks, block_size, watermark=0.0, null_block=True, sliding_window=window)
    group = request(0, num_tokens)
    kv.allocate(group)
    seq = group.seqs[0]
    seq.num_computed_tokens = num_tokens
    return kv, seq


def test_blocks_wholly_before_the_window_become_the_null_block():
    kv, seq = prefilled(window=8, num_tokens=20)  # 5 blocks; the next query (position 20) sees 13..20
    before = list(seq.block_table)
    free = kv.num_free_blocks
    freed = kv.remove_skipped_blocks(seq, 20)
    assert seq.block_table == [NULL_BLOCK] * 3 + before[3:], "tokens 0..11 (blocks 0-2) are out of the window; block 3 holds 13..15"
    assert sorted(freed) == sorted(before[:3]) and kv.num_free_blocks == free + 3, "the freed blocks go back to the pool"


def test_nothing_is_freed_twice_and_a_short_request_keeps_its_blocks():
    kv, seq = prefilled(window=8, num_tokens=6)
    assert kv.remove_skipped_blocks(seq, 6) == [] and NULL_BLOCK not in seq.block_table, "6 tokens all lie in a window of 8"
    kv, seq = prefilled(window=8, num_tokens=20)
    kv.remove_skipped_blocks(seq, 20)
    free = kv.num_free_blocks
    assert kv.remove_skipped_blocks(seq, 20) == [] and kv.num_free_blocks == free, "a null entry is never freed again"


def test_decoding_holds_at_most_the_window_and_one_block():
    kv, seq = prefilled(window=8, num_tokens=9)
    for _ in range(40):
        seq.append_token(1)
        kv.append_slot(seq)
        held = [b for b in seq.block_table if b != NULL_BLOCK]
        assert len(held) <= -(-(8 - 1) // 4) + 1, f"{seq.num_tokens} tokens hold {len(held)} blocks: the window needs 3 at most"
        seq.num_computed_tokens = seq.num_tokens
    assert len(seq.block_table) == -(-seq.num_tokens // 4), "the table keeps one entry per logical block"
