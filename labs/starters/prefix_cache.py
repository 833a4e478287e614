"""Lab prefix_cache: Prefix caching: the block hash chain, hits, eviction / 前缀缓存：块哈希链、命中与驱逐.

The hash chain of a prompt's full blocks (each hash covers its parent's), the longest run of cached
leading blocks (token ids and parent checked), caching a written block, and dropping a cached
block's hash when the least recently freed block at the head of the free queue is handed out again
(LRU eviction).

提示词满块的哈希链（每个哈希都包含父块的哈希）、已缓存的最长前导块序列（同时核对 token id 与父哈希）、缓存一个写好的块，以及空闲队列队头那个最早释放的块被重新分配时删除它的哈希（LRU 驱逐）。

Your part plugs into the engine in place of its own, in engine/core/prefix_cache.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade prefix_cache --impl labs/mine

Cut by `python -m lessons labs build` from engine/core/prefix_cache.py; work on a copy.

The module engine/core/prefix_cache.py, for context:

Automatic prefix caching: full KV blocks named by a hash of their tokens and of everything before them.

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

LAB = "prefix_cache"  # the lab whose parts this file holds


class PrefixCache:
    """The map ``block_hash -> physical block`` and what each cached block holds.

    Only the allocator (``PagedBlockManager``) writes it: ``insert`` once a full block's KV is written,
    ``evict`` when a free cached block is handed out again.

    Args:
        num_blocks, block_size: the pool.
        hash_fn: ``(parent_hash, token_ids, extra_keys) -> bytes``; tests pass a weakened one.
    """

    # Given (the engine's own, not swapped): the attributes and special methods the parts below use.
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
        # TODO(prefix_cache): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab prefix_cache: PrefixCache.block_hashes")

    def lookup(self, token_ids: list[int], hashes: list[BlockHash]) -> list[int]:
        """Cached blocks for the leading blocks of a prompt: the longest run of hits from block 0.

        A hit needs the hash in the map *and* the block's stored token ids and parent hash equal to
        the prompt's; the first miss ends the run (a block's KV depends on its whole prefix)."""
        # TODO(prefix_cache): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab prefix_cache: PrefixCache.lookup")

    def insert(self, block_id: int, block_hash: BlockHash, parent_hash: BlockHash | None, token_ids: Sequence[int]) -> bool:
        """Cache a full block whose KV has been written. False (nothing changes) when the block is
        cached already (a hit, or shared by a fork) or another block holds this hash (two requests
        computed the same tokens in one step: the map keeps the first, the other block stays plain)."""
        # TODO(prefix_cache): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab prefix_cache: PrefixCache.insert")

    def evict(self, block_id: int) -> BlockHash | None:
        """Drop a block's hash as it is handed out again; returns the hash (None: it had none)."""
        # TODO(prefix_cache): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab prefix_cache: PrefixCache.evict")
