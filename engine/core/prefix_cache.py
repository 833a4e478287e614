"""Automatic prefix caching: full KV blocks named by a hash of their tokens and of everything before them.

Requests that begin with the same tokens (a system prompt, few-shot examples, a chat history) need the
same K and V for those tokens. Once a block is full and its KV written, it is given a *block hash*:

    block_hash = SHA-256(parent block hash, the block's token ids, extra keys)

so a hash names the block's tokens *and* its whole prefix. A map ``block_hash -> block`` finds, for a
new prompt, the longest run of leading blocks already computed; the prompt's prefill computes only the
rest (PagedAttention paper §4.4 "shared prefix", Figure 10; vLLM v1's automatic prefix caching,
docs/design/prefix_caching.md, ``vllm/v1/core/block_pool.py``, ``kv_cache_utils.hash_block_tokens``).

A freed block keeps its hash: it is *cached and evictable*, free memory that still holds reusable
KV. The free queue (``engine/core/block_manager.py``) hands blocks out from its head, least recently
freed first; a cached block taken there is *evicted* (its hash leaves the map).

SHA-256 of a canonical byte encoding, never Python's ``hash()``, which is salted per process: the
same prompt gets the same hashes in every run. A hit still compares the block's token ids and its
parent hash, so a collision of a weakened hash can never serve another prompt's KV.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Callable, Sequence

from engine.core.lab_impl import plug_lab_parts

BlockHash = bytes
HashFn = Callable[[BlockHash | None, Sequence[int], tuple], BlockHash]


def hash_block_tokens(parent_hash: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple = ()) -> BlockHash:
    """The hash of one full block (vLLM's ``hash_block_tokens``), 32 bytes.

    Canonical encoding: a presence byte and the 32-byte parent hash (none for a prompt's first
    block), the token count and each token id as little-endian int64, then the extra keys as JSON
    (nothing here uses them yet; LoRA ids, image hashes or a cache salt would go there).

    Args:
        parent_hash: the previous block's hash, None for block 0.
        token_ids: the block's ``block_size`` token ids.
        extra_keys: JSON-serialisable values that must also match for a hit.
    """
    digest = hashlib.sha256()
    digest.update(b"\x00" if parent_hash is None else b"\x01" + parent_hash)
    digest.update(struct.pack(f"<I{len(token_ids)}q", len(token_ids), *token_ids))
    digest.update(json.dumps(list(extra_keys)).encode())
    return digest.digest()


@dataclass
class PrefixCacheStats:
    """Engine-wide prefix-cache counters, in tokens (vLLM's ``PrefixCacheStats``).

    A request is counted when it is admitted: its tokens are *queried*, those found cached are *hits*.
    Re-prefills after a preemption are counted apart (``preempted_*``): they hit their own blocks and
    would inflate the rate (vllm-project/vllm#25780). The scheduler counts queries and hits, once
    per admission (``Scheduler.prefix_cache_stats``); the cache counts evictions
    (``PrefixCache.num_evictions``).

    Attributes:
        queries, hits: tokens looked up and found, first prefills.
        preempted_queries, preempted_hits: the same for re-prefills after preemption.
        evictions: cached blocks whose hash was dropped because the block was allocated again.
    """

    queries: int = 0
    hits: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    evictions: int = 0

    @property
    def hit_rate(self) -> float:
        """hits / queries of first prefills, 0..1 (0 before any query)."""
        return self.hits / self.queries if self.queries else 0.0


class PrefixCache:
    """The map ``block_hash -> physical block`` and what each cached block holds.

    Only the allocator (``PagedBlockManager``) writes it: ``insert`` once a full block's KV is written,
    ``evict`` when a free cached block is handed out again.

    Args:
        num_blocks, block_size: the pool.
        hash_fn: ``(parent_hash, token_ids, extra_keys) -> bytes``; tests pass a weakened one.
    """

    null_block: int | None = None  # a sliding-window group's placeholder entry (never cached)

    def __init__(self, num_blocks: int, block_size: int, hash_fn: HashFn = hash_block_tokens):
        self.block_size = block_size
        self.hash_fn = hash_fn
        self.cached_blocks: dict[BlockHash, int] = {}  # vLLM's cached_block_hash_to_block
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self.parent_hash: list[BlockHash | None] = [None] * num_blocks
        self.block_token_ids: list[tuple[int, ...] | None] = [None] * num_blocks
        self.num_evictions = 0  # cached blocks whose hash was dropped: the block was allocated again

    def block_hashes(self, token_ids: list[int], num_blocks: int, known: list[BlockHash]) -> list[BlockHash]:
        """The hash chain of the first ``num_blocks`` full blocks of ``token_ids``, extending ``known``
        (the hashes already computed for this sequence) in place."""
        # BEGIN SOLUTION prefix_cache
        bs = self.block_size
        while len(known) < num_blocks:
            i = len(known)
            known.append(self.hash_fn(known[-1] if known else None, token_ids[i * bs : (i + 1) * bs], ()))
        return known[:num_blocks]
        # END SOLUTION

    def lookup(self, token_ids: list[int], hashes: list[BlockHash]) -> list[int]:
        """Cached blocks for the leading blocks of a prompt: the longest run of hits from block 0.

        A hit needs the hash in the map *and* the block's stored token ids and parent hash equal to
        the prompt's; the first miss ends the run (a block's KV depends on its whole prefix)."""
        # BEGIN SOLUTION prefix_cache
        bs, hits = self.block_size, []
        for i, block_hash in enumerate(hashes):
            block_id = self.cached_blocks.get(block_hash)
            if block_id is None or self.block_token_ids[block_id] != tuple(token_ids[i * bs : (i + 1) * bs]):
                break
            if self.parent_hash[block_id] != (hashes[i - 1] if i else None):
                break
            hits.append(block_id)
        return hits
        # END SOLUTION

    def insert(self, block_id: int, block_hash: BlockHash, parent_hash: BlockHash | None, token_ids: Sequence[int]) -> bool:
        """Cache a full block whose KV has been written. False (nothing changes) when the block is
        cached already (a hit, or shared by a fork) or another block holds this hash (two requests
        computed the same tokens in one step: the map keeps the first, the other block stays plain)."""
        # BEGIN SOLUTION prefix_cache
        if self.block_hash[block_id] is not None or block_hash in self.cached_blocks:
            return False
        self.cached_blocks[block_hash] = block_id
        self.block_hash[block_id] = block_hash
        self.parent_hash[block_id] = parent_hash
        self.block_token_ids[block_id] = tuple(token_ids)
        return True
        # END SOLUTION

    def evict(self, block_id: int) -> BlockHash | None:
        """Drop a block's hash as it is handed out again; returns the hash (None: it had none)."""
        # BEGIN SOLUTION prefix_cache
        block_hash = self.block_hash[block_id]
        if block_hash is None:
            return None
        del self.cached_blocks[block_hash]
        self.block_hash[block_id] = self.parent_hash[block_id] = self.block_token_ids[block_id] = None
        self.num_evictions += 1
        return block_hash
        # END SOLUTION

    # The interface the allocator calls, which the radix tree (engine/core/radix_cache.py) also answers.

    def match(self, token_ids: list[int], num_blocks: int, known: list[BlockHash]) -> list[int]:
        """The cached blocks of the first ``num_blocks`` full blocks of ``token_ids`` (hashes
        computed into ``known``, then :meth:`lookup`)."""
        return self.lookup(token_ids, self.block_hashes(token_ids, num_blocks, known))

    def commit(self, seq_id: int, token_ids: list[int], block_table: list[int], start: int, end: int,
               known: list[BlockHash]) -> list[tuple[int, int]]:
        """Cache blocks ``start .. end - 1`` of a sequence, full and written (:meth:`insert`). A
        block already cached under another physical block stays a plain block: returns []."""
        hashes, bs = self.block_hashes(token_ids, end, known), self.block_size
        for i in range(start, end):
            if block_table[i] == self.null_block:  # freed out of a sliding window before it was cached
                continue
            self.insert(block_table[i], hashes[i], hashes[i - 1] if i else None, token_ids[i * bs : (i + 1) * bs])
        return []

    def describe(self, block_id: int) -> tuple[BlockHash, BlockHash | None, tuple[int, ...]]:
        """A cached block's hash, its parent's hash and its token ids (what the CPU tier keeps)."""
        return self.block_hash[block_id], self.parent_hash[block_id], self.block_token_ids[block_id]

    def lock(self, seq_id: int, blocks: list[int]) -> None:
        """A sequence took a hit's blocks: their reference counts protect them here."""

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """A sequence was forked: nothing to record beyond the blocks' reference counts."""

    def release(self, seq_id: int) -> None:
        """A sequence gave its blocks up: nothing to record beyond the blocks' reference counts."""

    def entries(self) -> dict[int, tuple[str, str | None]]:
        """Every cached block (in use or free) -> (its block hash, its parent's hash), hex; the parent is
        None for a prompt's first block. Plain data for the app's pool map (hash and parent chain)."""
        return {b: (h.hex(), p.hex() if p is not None else None)
                for b, (h, p) in enumerate(zip(self.block_hash, self.parent_hash)) if h is not None}


plug_lab_parts(globals())  # labs: a student's part in place of the engine's (engine/core/lab_impl.py)
