"""Lab radix_match: The radix tree: match and split / 基数树：匹配与分裂.

SGLang's radix tree of cached blocks (RadixAttention): walk from the root along a prompt's full
blocks, child by the token ids of its first block, to the longest cached run, and split a node the
prompt leaves part-way so that every match ends on a node boundary.

SGLang 的缓存块基数树（RadixAttention）：从根出发沿提示词的满块向下走（按子节点第一个块的 token id 找子节点），找到最长的已缓存前缀；提示词在某个节点中途分岔时把该节点分裂，使每次匹配都结束在节点边界上。

Your part plugs into the engine in place of its own, in engine/core/radix_cache.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade radix_match --impl labs/mine

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

LAB = "radix_match"  # the lab whose parts this file holds


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

    def match(self, token_ids: list[int], num_blocks: int, known: list[BlockHash] | None = None) -> list[int]:
        """The cached blocks of the first ``num_blocks`` full blocks of ``token_ids``, the longest
        run from block 0 (SGLang's ``match_prefix``). A node left part-way is split so that the run
        ends on a node boundary. ``known`` (the hash chain's hashes) is not used.

        Walk from ``self.root``: a node's child is found by the token ids of its first block,
        ``node.children[tuple(block's tokens)]``; compare the child's blocks one by one (``child.key``
        holds ``len(child.blocks) * block_size`` tokens) and stop at the first block that differs or at
        ``num_blocks``. Advance ``self.clock`` once per lookup and stamp every node passed with
        ``self._access(node)`` (LRU: a matched leaf is not evicted before older ones).

        Returns:
            physical block ids, ``len <= num_blocks``: ``hits[i]`` holds block ``i``'s tokens.
        """
        # TODO(radix_match): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab radix_match: RadixCache.match")

    def _split(self, node: RadixNode, j: int) -> RadixNode:
        """Cut ``node`` after its first ``j`` blocks (SGLang's ``_split_node``); returns the upper part,
        which takes the node's place in the tree and its lock count.

        ``0 < j < len(node.blocks)``. The upper part is a new node, ``RadixNode(key, blocks, parent,
        self._new_id())``, with the first ``j`` blocks and their ``j * block_size`` tokens, the node's
        parent, ``lock_ref`` and ``last_access``; it replaces the node among the parent's children; the
        node keeps the rest and becomes its only child. ``self.node_of[block]`` names each block's node."""
        # TODO(radix_match): write this part (see the docstring and labs/README.md)
        raise NotImplementedError("lab radix_match: RadixCache._split")
