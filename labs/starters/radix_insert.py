"""Lab radix_insert: The radix tree: insert and LRU eviction of leaves / 基数树：插入与按 LRU 驱逐叶节点.

Insert a sequence's newly full blocks under the path it holds (lock counts moved to the new last
node, a block the tree already holds reported so its copy is freed), pick the least recently used
unlocked leaf from a heap with stale entries, and evict its last block.

把一个序列新填满的块插入到它持有的路径之下（锁计数移到新的末节点；树中已有的块要报告出来，以便释放这份副本），从含有过期条目的堆中选出最久未用的未锁定叶节点，并驱逐它的最后一个块。

Your part plugs into the engine in place of its own, in engine/core/radix_cache.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade radix_insert --impl labs/mine

Cut by `python -m lessons labs build` from engine/core/radix_cache.py; work on a copy.

The module engine/core/radix_cache.py, for context:

Prefix caching as a radix tree of KV blocks (SGLang's RadixAttention, Zheng et al. 2024, §3;
``sglang/srt/mem_cache/radix_cache.py``), behind the same interface as the hash chain
(``engine/core/prefix_cache.py``): ``PagedBlockManager(prefix_cache="radix")``.

The tree's edges are runs of token ids, block-aligned: a node holds ``k`` whole blocks, its key the
``k * block_size`` tokens they hold and its value the ``k`` physical block ids (``block_size=1``
gives SGLang's token granularity). The path from the root to a node spells a prefix; the blocks
along it hold that prefix's K and V. A lookup walks the tree from the root, block by block, and
*splits* a node where a prompt leaves it part-way, so that every match ends on a node boundary.

What the hash chain keeps implicit, the tree keeps as structure:

- **Lock counts** (SGLang's ``lock_ref``): every sequence that holds cached blocks holds the whole
  path from the root to one node, its *last node*; each node counts the sequences whose path passes
  through it. A node with ``lock_ref > 0`` is on a running request's path and is never evicted.
  Its blocks' reference counts in the pool equal its ``lock_ref``.
- **Eviction is LRU over leaves**: a free block is taken from the plain free blocks first; when
  none is left, the last block of the least recently used unlocked leaf is evicted (a leaf that
  empties leaves the tree, and its parent may become a leaf). The hash chain evicts the least
  recently *freed* block instead, which may be an inner block whose descendants then can never hit.
- **One copy per prefix**: when a sequence has computed a block the tree already holds (two
  requests with the same new prompt in one step), the sequence switches to the tree's block and
  its own copy is freed (SGLang's ``cache_unfinished_req`` rewrites ``req_to_token`` this way); the
  hash chain keeps the second copy as a plain block. The KV is the same: same tokens, same prefix.

Each cached block also carries the hash chain's 32-byte block hash, computed once when it enters
the tree, so events and the app name blocks the same way under either cache.
"""

from __future__ import annotations
import heapq
from typing import Iterator
from engine.core.prefix_cache import BlockHash, HashFn, PrefixCache, hash_block_tokens

LAB = "radix_insert"  # the lab whose parts this file holds


class RadixCache:
    """The radix tree over the pool's cached blocks (SGLang's ``RadixCache`` with ``page_size =
    block_size``).

    Only the allocator (``PagedBlockManager``) writes it, through the interface the hash chain also
    answers: :meth:`match` (the cached leading blocks of a prompt), :meth:`lock` (a sequence took
    them), :meth:`commit` (a sequence's newly full blocks), :meth:`fork`, :meth:`release` (a
    sequence freed its blocks or was swapped out) and :meth:`evict` (a free cached block is handed
    out again); :class:`RadixFreeQueue` chooses which free block that is.

    Args:
        num_blocks, block_size: the pool.
        hash_fn: names each cached block (``engine/core/prefix_cache.py``); lookups never hash.
    """

    # Given (the engine's own, not swapped): the attributes and special methods the parts below use.
    def __init__(self, num_blocks: int, block_size: int, hash_fn: HashFn = hash_block_tokens):
        self.block_size = block_size
        self.hash_fn = hash_fn
        self._next_node_id = 1
        self.root = RadixNode([], [], None, 0)
        self.root.lock_ref = 1  # never evicted
        self.node_of: list[RadixNode | None] = [None] * num_blocks
        self.block_hash: list[BlockHash | None] = [None] * num_blocks
        self.seq_node: dict[int, RadixNode] = {}  # seq_id -> the last node of the path it holds (SGLang's req.last_node)
        self.num_evictions = 0
        self.clock = 0
        self._leaves: list[tuple[int, int, RadixNode]] = []  # heap of (last_access, node_id, node); stale entries skipped

    def commit(self, seq_id: int, token_ids: list[int], block_table: list[int], start: int, end: int,
               known: list[BlockHash] | None = None) -> list[tuple[int, int]]:
        """Cache blocks ``start .. end - 1`` of a sequence (full, their KV written), extending the
        path it holds (SGLang's ``cache_unfinished_req``). ``start`` is where its path ends.

        Walk from the sequence's last node (``self.seq_node``, the root when it holds none) along
        ``token_ids`` as :meth:`match` does, from block ``start``: a block the tree holds already is
        passed (split a node left part-way), the rest go under the node reached
        (:meth:`_add_blocks`). Then the sequence holds the path to the node reached: lock it
        (``self._inc_lock``), unlock the old one (``self._dec_lock``), record it in ``self.seq_node``
        and stamp it (``self._access``; the inserted nodes carry the clock ``self._tick()`` gave).

        Returns:
            ``(logical index, tree block)`` for each block the tree already held under another
            physical block: the caller switches the sequence to the tree's block and frees its own.
        """
        # TODO(radix_insert): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab radix_insert: RadixCache.commit")

    def _add_blocks(self, node: RadixNode, own: RadixNode, token_ids: list[int], block_table: list[int], start: int, end: int,
                    prev_hash: BlockHash | None) -> RadixNode:
        """Blocks ``start .. end - 1`` under ``node``: appended to it when it is the sequence's own
        leaf (locked by it alone: the tree stays compressed as a request decodes), else a new child.

        A new child is ``RadixNode(key, blocks, node, self._new_id())``, found in ``node.children`` by
        the tokens of its first block. Each block added is named in ``self.node_of`` and gets its hash
        in ``self.block_hash``, the hash chain's: ``self.hash_fn(previous block's hash (prev_hash for
        the first), its tokens, ())``.
        Returns the node that holds them."""
        # TODO(radix_insert): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab radix_insert: RadixCache._add_blocks")

    def victim(self) -> int:
        """The block to evict next: the last block of the least recently used unlocked leaf.

        ``self._leaves`` is a heap of ``(last_access, node_id, node)`` pushed whenever a node may have
        become evictable (``self._push_if_evictable``); an entry is stale when the node is no longer
        evictable (``self._evictable``) or was accessed since (its ``last_access`` changed): pop those.

        Raises:
            AssertionError: no evictable leaf (the free queue asked for a cached block it does not hold).
        """
        # TODO(radix_insert): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab radix_insert: RadixCache.victim")

    def evict(self, block_id: int) -> BlockHash | None:
        """Drop a free block from the tree as it is handed out again; returns its block hash (None:
        it held no cached KV). Only a leaf's last block is ever evicted (:meth:`victim`).

        The leaf loses its last block and those tokens; a leaf left empty leaves the tree (its parent's
        ``children`` entry goes, its ``parent`` becomes None) and its parent may now be evictable. The
        block's ``node_of`` and ``block_hash`` are cleared; ``self.num_evictions`` counts it."""
        # TODO(radix_insert): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab radix_insert: RadixCache.evict")
