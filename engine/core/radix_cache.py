"""Prefix caching as a radix tree of KV blocks (SGLang's RadixAttention, Zheng et al. 2024, §3;
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

from engine.core.lab_impl import plug_lab_parts
from engine.core.prefix_cache import BlockHash, HashFn, PrefixCache, hash_block_tokens


class RadixNode:
    """One edge of the tree and the node below it.

    Attributes:
        key: the token ids of its blocks, ``len(blocks) * block_size`` of them.
        blocks: physical block ids, one per ``block_size`` tokens of ``key``.
        children: child nodes by the token ids of their first block (a tuple).
        parent: None for the root, and for a node that has left the tree.
        lock_ref: sequences whose path passes through this node (SGLang's ``lock_ref``).
        last_access: the cache's logical clock when a lookup or insert last passed through it.
    """

    __slots__ = ("key", "blocks", "children", "parent", "lock_ref", "last_access", "node_id")

    def __init__(self, key: list[int], blocks: list[int], parent: RadixNode | None, node_id: int):
        self.key, self.blocks, self.parent, self.node_id = key, blocks, parent, node_id
        self.children: dict[tuple[int, ...], RadixNode] = {}
        self.lock_ref = 0
        self.last_access = 0


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

    # --- Lookups ---------------------------------------------------------------------------------

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
        # BEGIN SOLUTION radix_match
        bs, node, hits, i = self.block_size, self.root, [], 0
        self.clock += 1
        while i < num_blocks:
            child = node.children.get(tuple(token_ids[i * bs : (i + 1) * bs]))
            if child is None:
                break
            j = 1
            while j < len(child.blocks) and i + j < num_blocks and child.key[j * bs : (j + 1) * bs] == token_ids[(i + j) * bs : (i + j + 1) * bs]:
                j += 1
            if j < len(child.blocks):
                child = self._split(child, j)
            hits += child.blocks
            i += j
            node = child
            self._access(node)
        return hits
        # END SOLUTION

    block_hashes = PrefixCache.block_hashes  # the hash chain of a prompt's blocks: the CPU tier is keyed by it

    def describe(self, block_id: int) -> tuple[BlockHash, BlockHash | None, tuple[int, ...]]:
        """A cached block's hash, the previous block's on its path and its token ids (what the CPU tier keeps)."""
        node, bs = self.node_of[block_id], self.block_size
        j = node.blocks.index(block_id)
        prev = node.blocks[j - 1] if j else (node.parent.blocks[-1] if node.parent.blocks else None)
        return self.block_hash[block_id], None if prev is None else self.block_hash[prev], tuple(node.key[j * bs : (j + 1) * bs])

    def lock(self, seq_id: int, blocks: list[int]) -> None:
        """Sequence ``seq_id`` now holds ``blocks``, a :meth:`match` just made: lock their path."""
        node = self.root if not blocks else self.node_of[blocks[-1]]
        assert node is not None and (not blocks or node.blocks[-1] == blocks[-1]), "a hit ends on a node boundary"
        self._inc_lock(node)
        self.seq_node[seq_id] = node

    def fork(self, parent_seq_id: int, child_seq_id: int) -> None:
        """A forked sequence holds its parent's blocks: it holds the parent's path too."""
        node = self.seq_node.get(parent_seq_id)
        if node is not None:
            self._inc_lock(node)
            self.seq_node[child_seq_id] = node

    def release(self, seq_id: int) -> None:
        """Sequence ``seq_id`` gave its blocks up (freed, preempted or swapped out): unlock its path."""
        node = self.seq_node.pop(seq_id, None)
        if node is not None:
            self._dec_lock(node)

    # --- Inserts ---------------------------------------------------------------------------------

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
        # BEGIN SOLUTION radix_insert
        bs, clock = self.block_size, self._tick()
        held = seq_id in self.seq_node
        assert held or start == 0, f"sequence {seq_id} commits from block {start} but holds no path"
        old = self.seq_node.get(seq_id, self.root)
        node, i, replaced = old, start, []
        prev_hash = self.block_hash[node.blocks[-1]] if node.blocks else None
        while i < end:
            child = node.children.get(tuple(token_ids[i * bs : (i + 1) * bs]))
            if child is None:
                node = self._add_blocks(node, old, token_ids, block_table, i, end, prev_hash)
                break
            j = 0
            while j < len(child.blocks) and i < end and child.key[j * bs : (j + 1) * bs] == token_ids[i * bs : (i + 1) * bs]:
                if child.blocks[j] != block_table[i]:
                    replaced.append((i, child.blocks[j]))
                prev_hash = self.block_hash[child.blocks[j]]
                i, j = i + 1, j + 1
            if j < len(child.blocks):
                child = self._split(child, j)
            node = child
            node.last_access = clock
        self._inc_lock(node)
        if held:
            self._dec_lock(old)
        self.seq_node[seq_id] = node
        self._access(node)
        return replaced
        # END SOLUTION

    def _add_blocks(self, node: RadixNode, own: RadixNode, token_ids: list[int], block_table: list[int], start: int, end: int,
                    prev_hash: BlockHash | None) -> RadixNode:
        """Blocks ``start .. end - 1`` under ``node``: appended to it when it is the sequence's own
        leaf (locked by it alone: the tree stays compressed as a request decodes), else a new child.

        A new child is ``RadixNode(key, blocks, node, self._new_id())``, found in ``node.children`` by
        the tokens of its first block. Each block added is named in ``self.node_of`` and gets its hash
        in ``self.block_hash``, the hash chain's: ``self.hash_fn(previous block's hash (prev_hash for
        the first), its tokens, ())``.
        Returns the node that holds them."""
        # BEGIN SOLUTION radix_insert
        bs = self.block_size
        if node is own and node is not self.root and not node.children and node.lock_ref == 1:
            target = node
            target.key += token_ids[start * bs : end * bs]
            target.blocks += block_table[start:end]
        else:
            target = RadixNode(list(token_ids[start * bs : end * bs]), list(block_table[start:end]), node, self._new_id())
            node.children[tuple(target.key[:bs])] = target
        for i in range(start, end):
            block = block_table[i]
            assert self.node_of[block] is None, f"block {block} is cached already"
            self.node_of[block] = target
            prev_hash = self.block_hash[block] = self.hash_fn(prev_hash, token_ids[i * bs : (i + 1) * bs], ())
        return target
        # END SOLUTION

    def _split(self, node: RadixNode, j: int) -> RadixNode:
        """Cut ``node`` after its first ``j`` blocks (SGLang's ``_split_node``); returns the upper part,
        which takes the node's place in the tree and its lock count.

        ``0 < j < len(node.blocks)``. The upper part is a new node, ``RadixNode(key, blocks, parent,
        self._new_id())``, with the first ``j`` blocks and their ``j * block_size`` tokens, the node's
        parent, ``lock_ref`` and ``last_access``; it replaces the node among the parent's children; the
        node keeps the rest and becomes its only child. ``self.node_of[block]`` names each block's node."""
        # BEGIN SOLUTION radix_match
        bs = self.block_size
        top = RadixNode(node.key[: j * bs], node.blocks[:j], node.parent, self._new_id())
        top.lock_ref, top.last_access = node.lock_ref, node.last_access
        node.parent.children[tuple(top.key[:bs])] = top
        node.key, node.blocks, node.parent = node.key[j * bs :], node.blocks[j:], top
        top.children[tuple(node.key[:bs])] = node
        for block in top.blocks:
            self.node_of[block] = top
        return top
        # END SOLUTION

    # --- Locks and eviction ----------------------------------------------------------------------

    def _inc_lock(self, node: RadixNode | None) -> None:
        while node is not None:
            node.lock_ref += 1
            node = node.parent

    def _dec_lock(self, node: RadixNode | None) -> None:
        while node is not None:
            node.lock_ref -= 1
            assert node.lock_ref >= 0, "a node unlocked more often than locked"
            self._push_if_evictable(node)
            node = node.parent

    def _evictable(self, node: RadixNode) -> bool:
        return node.lock_ref == 0 and not node.children and node.parent is not None and bool(node.blocks)

    def _push_if_evictable(self, node: RadixNode) -> None:
        if self._evictable(node):
            heapq.heappush(self._leaves, (node.last_access, node.node_id, node))

    def _access(self, node: RadixNode) -> None:
        node.last_access = self.clock
        self._push_if_evictable(node)

    def victim(self) -> int:
        """The block to evict next: the last block of the least recently used unlocked leaf.

        ``self._leaves`` is a heap of ``(last_access, node_id, node)`` pushed whenever a node may have
        become evictable (``self._push_if_evictable``); an entry is stale when the node is no longer
        evictable (``self._evictable``) or was accessed since (its ``last_access`` changed): pop those.

        Raises:
            AssertionError: no evictable leaf (the free queue asked for a cached block it does not hold).
        """
        # BEGIN SOLUTION radix_insert
        while self._leaves:
            last_access, _, node = self._leaves[0]
            if self._evictable(node) and node.last_access == last_access:
                return node.blocks[-1]
            heapq.heappop(self._leaves)
        raise AssertionError("no evictable leaf, yet a free cached block was asked for")
        # END SOLUTION

    def evict(self, block_id: int) -> BlockHash | None:
        """Drop a free block from the tree as it is handed out again; returns its block hash (None:
        it held no cached KV). Only a leaf's last block is ever evicted (:meth:`victim`).

        The leaf loses its last block and those tokens; a leaf left empty leaves the tree (its parent's
        ``children`` entry goes, its ``parent`` becomes None) and its parent may now be evictable. The
        block's ``node_of`` and ``block_hash`` are cleared; ``self.num_evictions`` counts it."""
        # BEGIN SOLUTION radix_insert
        node = self.node_of[block_id]
        if node is None:
            return None
        assert self._evictable(node) and node.blocks[-1] == block_id, f"block {block_id} is not an unlocked leaf's last block"
        bs = self.block_size
        first = tuple(node.key[:bs])
        node.blocks.pop()
        del node.key[-bs:]
        self.node_of[block_id] = None
        block_hash, self.block_hash[block_id] = self.block_hash[block_id], None
        if node.blocks:
            self._push_if_evictable(node)
        else:
            parent = node.parent
            del parent.children[first]
            node.parent = None
            self._push_if_evictable(parent)
        self.num_evictions += 1
        return block_hash
        # END SOLUTION

    # --- Plain data for tests and the app --------------------------------------------------------

    def entries(self) -> dict[int, tuple[str, str | None]]:
        """Every cached block -> (its block hash, the previous block's on its path), hex, as
        ``PrefixCache.entries``."""
        out = {}
        for node in self.nodes():
            prev = node.parent.blocks[-1] if node.parent is not None and node.parent.blocks else None
            for block in node.blocks:
                out[block] = (self.block_hash[block].hex(), None if prev is None else self.block_hash[prev].hex())
                prev = block
        return out

    def nodes(self) -> Iterator[RadixNode]:
        """Every node but the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def tree(self) -> list[dict]:
        """The tree as plain rows, parents first: ``node_id``, ``parent_id`` (0: the root),
        ``token_ids``, ``blocks``, ``lock_ref``, ``last_access`` (the cache's logical clock)."""
        return [dict(node_id=n.node_id, parent_id=n.parent.node_id, token_ids=list(n.key), blocks=list(n.blocks),
                     lock_ref=n.lock_ref, last_access=n.last_access) for n in self.nodes()]

    def _new_id(self) -> int:
        self._next_node_id += 1
        return self._next_node_id - 1

    def _tick(self) -> int:
        self.clock += 1
        return self.clock


class RadixFreeQueue:
    """The pool's free queue under the radix cache (same interface as ``FreeBlockQueue``): plain
    free blocks, least recently freed first, then, once none is left, cached ones chosen by the
    tree (:meth:`RadixCache.victim`: LRU over unlocked leaves). Iterates plain blocks first, then
    cached ones in the order they were freed."""

    def __init__(self, block_ids: list[int], cache: RadixCache):
        self.cache = cache
        self.plain: dict[int, None] = {}
        self.cached: dict[int, None] = {}
        for block_id in block_ids:
            self.append(block_id)

    def __len__(self) -> int:
        return len(self.plain) + len(self.cached)

    def __iter__(self):
        yield from self.plain
        yield from self.cached

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.plain or block_id in self.cached

    def popleft(self) -> int:
        if self.plain:
            block_id = next(iter(self.plain))
            del self.plain[block_id]
            return block_id
        block_id = self.cache.victim()
        del self.cached[block_id]
        return block_id

    def append(self, block_id: int) -> None:
        assert block_id not in self, f"block {block_id} is free already"
        (self.cached if self.cache.node_of[block_id] is not None else self.plain)[block_id] = None

    def remove(self, block_id: int) -> None:
        if self.plain.pop(block_id, 0) is None:
            return
        del self.cached[block_id]


plug_lab_parts(globals())  # labs: a student's part in place of the engine's (engine/core/lab_impl.py)
