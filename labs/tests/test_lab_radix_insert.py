"""Lab radix_insert: inserting a sequence's full blocks into the radix tree (lock counts, one copy per
prefix, the hash chain) and evicting the least recently used unlocked leaf's last block
(engine/core/radix_cache.py, SGLang's cache_unfinished_req and evict)."""

import pytest

from engine.core.prefix_cache import hash_block_tokens
from engine.core.radix_cache import RadixCache

BS = 2
A = [1, 2, 3, 4, 5, 6]


def chain(tokens):
    out = []
    for i in range(len(tokens) // BS):
        out.append(hash_block_tokens(out[-1] if out else None, tokens[i * BS : (i + 1) * BS], ()))
    return out


def test_a_first_insert_is_one_locked_node_with_the_hash_chain():
    cache = RadixCache(16, BS)
    assert cache.commit(1, A, [5, 6, 7], 0, 3) == [], "nothing was cached before: no block to switch"
    (row,) = cache.tree()
    assert row["parent_id"] == 0 and row["blocks"] == [5, 6, 7] and row["token_ids"] == A, "one child of the root holds the three blocks"
    assert row["lock_ref"] == 1 and cache.seq_node[1].blocks == [5, 6, 7], "the sequence holds (locks) the path to its last node"
    assert [cache.block_hash[b] for b in (5, 6, 7)] == chain(A), "each block's hash chains its parent's (hash_fn(prev, tokens, ()))"


def test_a_decoding_sequence_extends_its_own_leaf():
    cache = RadixCache(16, BS)
    cache.commit(1, A[:4], [5, 6], 0, 2)
    cache.commit(1, A, [5, 6, 7], 2, 3)
    assert [r["blocks"] for r in cache.tree()] == [[5, 6, 7]], "a leaf the sequence alone holds grows in place (the tree stays compressed)"
    assert cache.root.children[(1, 2)].lock_ref == 1, "still one lock: the path moved, it was not locked twice"


def test_the_same_prefix_twice_keeps_one_copy():
    cache = RadixCache(16, BS)
    cache.commit(1, A, [5, 6, 7], 0, 3)
    assert cache.commit(2, A, [8, 9, 10], 0, 3) == [(0, 5), (1, 6), (2, 7)], \
        "blocks the tree holds already are reported (logical index, tree block): the caller frees its copy"
    assert cache.node_of[8] is None and cache.seq_node[2] is cache.seq_node[1], "the second copy is not cached; both hold one path"
    assert cache.seq_node[1].lock_ref == 2, "two sequences hold the node"


def test_a_prompt_that_diverges_splits_and_adds_a_branch():
    cache = RadixCache(16, BS)
    cache.commit(1, A, [5, 6, 7], 0, 3)
    other = A[:2] + [8, 8, 9, 9]
    assert cache.commit(2, other, [5, 11, 12], 0, 3) == [], "block 0 is the tree's own block 5: nothing to switch"
    rows = sorted((r["blocks"], r["lock_ref"]) for r in cache.tree())
    assert rows == [([5], 2), ([6, 7], 1), ([11, 12], 1)], f"the node splits after block 0 and a branch holds the rest: {rows}"
    assert [cache.block_hash[b] for b in (5, 11, 12)] == chain(other), "the branch's hashes chain from its parent's"


def test_release_then_evict_the_least_recently_used_leaf_first():
    cache = RadixCache(16, BS)
    cache.commit(1, A, [5, 6, 7], 0, 3)
    cache.commit(2, A[:2] + [8, 8], [5, 11], 0, 2)
    cache.release(1)
    cache.release(2)  # both leaves are unlocked; request 1's was used first
    assert cache.victim() == 7, "the least recently used unlocked leaf gives its last block"
    assert cache.evict(7) == chain(A)[2] and cache.node_of[7] is None, "evict returns the block's hash and forgets the block"
    assert cache.victim() == 6 and cache.evict(6) is not None, "the same leaf, one block shorter, is still the oldest"
    assert cache.victim() == 11, "an emptied leaf leaves the tree: the other leaf is next"
    cache.evict(11)
    assert cache.victim() == 5, "a parent whose last child left becomes a leaf, and evictable"
    cache.evict(5)
    assert cache.tree() == [] and cache.num_evictions == 4, "every block evicted, each counted"


def test_a_locked_leaf_is_never_a_victim():
    cache = RadixCache(16, BS)
    cache.commit(1, A, [5, 6, 7], 0, 3)
    with pytest.raises(AssertionError):
        cache.victim()  # the only leaf is held by a running sequence
    cache.commit(2, [9, 9], [3], 0, 1)
    cache.release(2)
    assert cache.victim() == 3, "only the unlocked leaf can go"
    assert cache.evict(4) is None, "a block the tree does not hold: nothing to evict"


def test_a_lookup_makes_a_leaf_recently_used():
    cache = RadixCache(16, BS)
    cache.commit(1, [1, 1], [3], 0, 1)
    cache.commit(2, [2, 2], [4], 0, 1)
    cache.release(1)
    cache.release(2)
    cache.match([1, 1], 1)  # block 3's leaf used again: the heap's old entry for it is stale
    assert cache.victim() == 4, "a leaf accessed since it was pushed is not the least recently used"
