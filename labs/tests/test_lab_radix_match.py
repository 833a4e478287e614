"""Lab radix_match: the radix tree's lookup, block by block from the root, and the split of a node a
prompt leaves part-way (engine/core/radix_cache.py, SGLang's match_prefix and _split_node)."""

from engine.core.block_manager import PagedBlockManager
from engine.core.radix_cache import RadixCache, RadixNode

from labkit import request

BS = 2
A = [1, 2, 3, 4, 5, 6]  # three blocks of 2 tokens


def hang(cache: RadixCache, key: list[int], blocks: list[int], lock_ref: int = 0) -> RadixNode:
    """A node holding ``blocks`` (their tokens ``key``) under the root, built by hand: these tests need no
    insert (the radix_insert lab's)."""
    node = RadixNode(list(key), list(blocks), cache.root, cache._new_id())
    node.lock_ref = lock_ref
    cache.root.children[tuple(key[:BS])] = node
    for block in blocks:
        cache.node_of[block] = node
    return node


def tree_with_a(lock_ref: int = 0) -> RadixCache:
    """A tree holding A in blocks 5, 6, 7, as one node."""
    cache = RadixCache(16, BS)
    hang(cache, A, [5, 6, 7], lock_ref)
    return cache


def test_a_whole_prompt_matches_every_block_in_order():
    cache = tree_with_a()
    assert cache.match(A, 3) == [5, 6, 7], "every block of a cached prompt is a hit, block 0 first"
    assert cache.match(A + [7, 8], 4) == [5, 6, 7], "blocks past the tree are no hit"
    assert cache.match([9, 9] + A[2:], 3) == [], "a first block the root has no child for: no hit at all"
    assert len(list(cache.nodes())) == 1, "matching a whole node does not split it"


def test_a_prompt_that_leaves_a_node_part_way_splits_it():
    cache = tree_with_a()
    assert cache.match(A[:4] + [0, 0], 3) == [5, 6], "the run ends at the first block whose tokens differ"
    rows = {tuple(r["blocks"]): r for r in cache.tree()}
    assert set(rows) == {(5, 6), (7,)}, f"the node is cut after the matched blocks: {sorted(rows)}"
    top, bottom = rows[(5, 6)], rows[(7,)]
    assert top["parent_id"] == 0 and bottom["parent_id"] == top["node_id"], "the upper part takes the node's place; the rest hangs under it"
    assert top["token_ids"] == A[:4] and bottom["token_ids"] == A[4:], "each part keeps its blocks' tokens"
    assert cache.node_of[5].node_id == top["node_id"] and cache.node_of[7].node_id == bottom["node_id"], "node_of names each block's node"
    assert cache.match(A, 3) == [5, 6, 7], "the split tree still matches the whole prompt"


def test_num_blocks_stops_the_walk_and_splits_there():
    cache = tree_with_a()
    assert cache.match(A, 1) == [5], "at most num_blocks blocks"
    assert sorted(tuple(r["blocks"]) for r in cache.tree()) == [(5,), (6, 7)], "a match that stops inside a node splits it there"


def test_a_split_keeps_the_lock_count_and_the_lookup_stamps_the_clock():
    cache = tree_with_a(lock_ref=1)  # a running sequence holds the path
    clock = cache.clock
    assert cache.match(A, 2) == [5, 6]
    top, bottom = cache.node_of[5], cache.node_of[7]
    assert top.lock_ref == bottom.lock_ref == 1, "the upper part takes the node's lock count: the holder's path passes through both"
    assert cache.clock == clock + 1, "one lookup advances the clock once"
    assert top.last_access == cache.clock, "a node the lookup passes is stamped (self._access): LRU keeps it"


def test_the_allocator_finds_a_shared_prefix_through_the_tree():
    kv = PagedBlockManager(8, BS, watermark=0.0, enable_caching=True, prefix_cache="radix")
    hang(kv.prefix_cache, A, [5, 6, 7])
    second = request(1, 7)
    second.seqs[0].token_ids = A[:4] + [77, 78, 79]
    blocks, tokens = kv.get_computed_blocks(second)
    assert blocks == [5, 6] and tokens == 4, "the second prompt shares two full blocks of the cached one: both hit"
