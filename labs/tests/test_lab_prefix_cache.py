"""Lab prefix_cache: the block hash chain, hits checked on tokens and parents, insert, eviction."""

from engine.core.block_manager import PagedBlockManager
from engine.core.prefix_cache import PrefixCache, hash_block_tokens

from labkit import request


def chain(tokens, bs):
    out = []
    for i in range(len(tokens) // bs):
        out.append(hash_block_tokens(out[-1] if out else None, tokens[i * bs : (i + 1) * bs], ()))
    return out


def test_block_hashes_is_a_chain_over_full_blocks():
    cache = PrefixCache(8, 4)
    tokens = list(range(10))
    known = []
    got = cache.block_hashes(tokens, 2, known)
    assert got == chain(tokens, 4), "hash i = hash_fn(hash i-1 (None for block 0), the block's tokens, ())"
    assert known == got, "the hashes are appended to `known` (kept on the sequence)"
    again = cache.block_hashes(tokens, 1, known)
    assert again == got[:1] and len(known) == 2, "known hashes are reused, not recomputed; the first num_blocks returned"


def test_lookup_returns_the_longest_cached_run_from_block_zero():
    cache = PrefixCache(8, 4)
    a = list(range(12))
    ha = chain(a, 4)
    for block, (i, h) in zip((5, 2, 7), enumerate(ha)):
        assert cache.insert(block, h, ha[i - 1] if i else None, a[i * 4 : (i + 1) * 4]) is True
    assert cache.lookup(a, ha) == [5, 2, 7], "every block of the same prompt is a hit, in order"
    b = a[:4] + [99, 98, 97, 96] + a[8:]
    assert cache.lookup(b, chain(b, 4)) == [5], "the first miss ends the run: block 2 of b has another parent"
    c = [50] + a[1:]
    assert cache.lookup(c, chain(c, 4)) == [], "a different first block: no hit"


def test_a_hash_collision_is_not_a_hit():
    weak = lambda parent, tokens, extra: b"same"  # noqa: E731 - every block collides
    cache = PrefixCache(8, 4, hash_fn=weak)
    cache.insert(3, b"same", None, [1, 2, 3, 4])
    other = [5, 6, 7, 8]
    assert cache.lookup(other, cache.block_hashes(other, 1, [])) == [], "a hit must also match the block's token ids"


def test_insert_and_evict():
    cache = PrefixCache(8, 4)
    h = chain([1, 2, 3, 4], 4)[0]
    assert cache.insert(3, h, None, [1, 2, 3, 4]) is True
    assert cache.insert(3, h, None, [1, 2, 3, 4]) is False, "a block cached already is not cached again"
    assert cache.insert(4, h, None, [1, 2, 3, 4]) is False, "another block with the same hash: the map keeps the first"
    assert cache.evict(4) is None, "evicting a block without a hash returns None"
    assert cache.evict(3) == h and cache.lookup([1, 2, 3, 4], [h]) == [], "evict drops the hash and returns it"
    assert cache.num_evictions == 1


def test_the_least_recently_freed_cached_block_is_evicted_first():
    kv = PagedBlockManager(4, 4, watermark=0.0, enable_caching=True)
    groups = [request(i, 8) for i in range(2)]
    for g in groups:
        kv.allocate(g)
        g.seqs[0].num_computed_tokens = 8
        kv.cache_blocks(g.seqs)
    for g in groups:
        kv.free(g.seqs[0])
    cached = kv.cached_free_blocks()
    assert len(cached) == 4, "freed full blocks stay cached and evictable"
    new = request(5, 4)
    kv.allocate(new)
    assert new.seqs[0].block_table == [cached[0]], "allocation takes the head: the least recently freed cached block"
    assert kv.prefix_cache.block_hash[cached[0]] is None, "handing a cached block out again evicts its hash"
    again = request(1, 9)
    again.seqs[0].token_ids = list(groups[1].seqs[0].token_ids) + [1]
    hits, tokens = kv.get_computed_blocks(again)
    assert tokens == 8, "the second request's blocks are still cached: a new request with its prompt hits both"
