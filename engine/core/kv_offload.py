"""A CPU tier under the prefix cache: evicted cached blocks are copied to host memory instead of
dropped, and a later hit loads them back instead of recomputing them (SGLang's hierarchical cache,
``sglang/srt/mem_cache/hiradix_cache.py``; vLLM's KV offloading, ``vllm/v1/kv_offload/``, whose
CPU backend keeps an LRU of blocks keyed by block hash).

The tier holds ``num_blocks`` CPU blocks of the pool's layout, keyed by the hash chain's block hash
(``engine/core/prefix_cache.py``: the hash names a block's tokens and its whole prefix), so it
serves the hash chain and the radix tree alike. It is least recently used first: offloading into a
full tier drops its LRU block. A block loaded back stays in the tier too (its host copy is still
valid), so evicting it again later costs no copy.

The copies run at the start of the step, with swap preemption's (``ModelRunner.swap``): GPU -> CPU
copies first (an evicted block may be handed out again in the same step), then CPU -> GPU loads.
A request pins every CPU hit it is about to load before it takes its first GPU block for them
(vLLM's ``prepare_load``, SGLang's ``inc_lock_ref`` in ``HiRadixCache.load_back``): taking a GPU
block may evict a cached one into the full tier, and the tier must then drop another block, not a
hit that is about to be read. The pins hold until the step's copies are taken, so no offload of
the same step overwrites a block before its load has run.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from engine.core.prefix_cache import BlockHash

LOADED_BACK = "loaded back from CPU block"  # a CACHE_HIT event's detail when the hit came from the CPU tier


@dataclass
class KVOffloadStats:
    """One step's traffic between the tiers and each tier's cached blocks after it
    (``StepReport.kv_offload``).

    Attributes:
        offloaded: GPU blocks copied to the CPU tier as they were evicted this step.
        loaded: GPU blocks that a prefix hit filled from the CPU tier this step.
        dropped: CPU blocks dropped from the full tier this step (least recently used first).
        gpu_cached_blocks: GPU blocks that hold cached KV after the step (in use or free).
        cpu_blocks: CPU tier blocks that hold cached KV after the step; cpu_capacity: its size.
        copies_out: the offloads as ``(gpu block, tier block)``; copies_in: the loads as ``(tier
            block, gpu block)``; a tier block is numbered 0 .. cpu_capacity - 1.
        cpu_held: the tier blocks that hold cached KV after the step, ascending.
    """

    offloaded: list[int] = field(default_factory=list)
    loaded: list[int] = field(default_factory=list)
    dropped: int = 0
    gpu_cached_blocks: int = 0
    cpu_blocks: int = 0
    cpu_capacity: int = 0
    copies_out: list[tuple[int, int]] = field(default_factory=list)
    copies_in: list[tuple[int, int]] = field(default_factory=list)
    cpu_held: list[int] = field(default_factory=list)


class KVOffloadTier:
    """The CPU tier: block hash -> CPU block, least recently used first.

    Args:
        num_blocks: CPU blocks in the tier (>= 1).
        base: the id of its first block in the host cache (after swap preemption's CPU pool).
    """

    def __init__(self, num_blocks: int, base: int = 0):
        self.num_blocks, self.base = num_blocks, base
        self.free = list(range(base + num_blocks - 1, base - 1, -1))  # popped from the end: base first
        self.entries: OrderedDict[BlockHash, int] = OrderedDict()
        self.meta: dict[int, tuple[BlockHash, BlockHash | None, tuple[int, ...]]] = {}  # cpu block -> hash, parent hash, tokens
        self.pinned: set[int] = set()
        self.copies_out: list[tuple[int, int]] = []  # (gpu, cpu)
        self.copies_in: list[tuple[int, int]] = []  # (cpu, gpu)
        self.step = KVOffloadStats(cpu_capacity=num_blocks)
        self.num_offloaded = self.num_loaded = self.num_dropped = 0

    def offload(self, gpu_block: int, block_hash: BlockHash, parent_hash: BlockHash | None, token_ids: tuple[int, ...]) -> bool:
        """Keep an evicted GPU block's KV: copy it to a CPU block (the LRU one dropped when the tier
        is full). False when the tier has it already (no copy) or every CPU block is pinned."""
        if block_hash in self.entries:
            self.entries.move_to_end(block_hash)
            return False
        if not self.free and not self._drop_lru():
            return False
        cpu = self.free.pop()
        self.entries[block_hash] = cpu
        self.meta[cpu] = (block_hash, parent_hash, tuple(token_ids))
        self.copies_out.append((gpu_block, cpu))
        self.step.offloaded.append(gpu_block)
        self.step.copies_out.append((gpu_block, cpu - self.base))
        self.num_offloaded += 1
        return True

    def _drop_lru(self) -> bool:
        for block_hash, cpu in self.entries.items():
            if cpu not in self.pinned:
                del self.entries[block_hash]
                del self.meta[cpu]
                self.free.append(cpu)
                self.step.dropped += 1
                self.num_dropped += 1
                return True
        return False

    def lookup(self, token_ids: list[int], hashes: list[BlockHash], start: int, block_size: int) -> list[int]:
        """CPU blocks for blocks ``start, start + 1, ...`` of a prompt whose first ``start`` blocks hit
        on the GPU: the longest run found here. As on the GPU, a hit compares the tokens and the
        parent hash too."""
        hits = []
        for i in range(start, len(hashes)):
            cpu = self.entries.get(hashes[i])
            if cpu is None:
                break
            _, parent, tokens = self.meta[cpu]
            if tokens != tuple(token_ids[i * block_size : (i + 1) * block_size]) or parent != (hashes[i - 1] if i else None):
                break
            hits.append(cpu)
        return hits

    def pin(self, cpu_blocks: list[int]) -> None:
        """Keep ``cpu_blocks`` (hits a request is about to load) in the tier until the step's copies
        are taken (:meth:`take_copies`): a full tier drops only unpinned blocks."""
        self.pinned.update(cpu_blocks)

    def load(self, cpu_block: int, gpu_block: int, block_hash: BlockHash) -> None:
        """Queue the copy of a pinned CPU hit, the block named ``block_hash``, into ``gpu_block``.

        Raises:
            AssertionError: the CPU block was not pinned or now holds another block (it was dropped
                and reused after the lookup that found it).
        """
        assert cpu_block in self.pinned, f"CPU block {cpu_block} is loaded without being pinned first"
        assert self.meta[cpu_block][0] == block_hash, f"CPU block {cpu_block} holds another block than the hit asked for"
        self.entries.move_to_end(block_hash)
        self.copies_in.append((cpu_block, gpu_block))
        self.step.loaded.append(gpu_block)
        self.step.copies_in.append((cpu_block - self.base, gpu_block))
        self.num_loaded += 1

    def discard(self, copies_out: list[tuple[int, int]], copies_in: list[tuple[int, int]]) -> None:
        """Undo a step's copies that never ran (the step raised before or in them): the CPU blocks
        that were to receive an offload hold no KV and leave the tier, and the step's record
        forgets both kinds. The CPU blocks of the loads keep their KV (only read from)."""
        for gpu, cpu in copies_out:
            if cpu in self.meta:  # else dropped again in the same step
                del self.entries[self.meta.pop(cpu)[0]]
                self.free.append(cpu)
            self.step.offloaded.remove(gpu)
            self.step.copies_out.remove((gpu, cpu - self.base))
            self.num_offloaded -= 1
        for cpu, gpu in copies_in:
            self.step.loaded.remove(gpu)
            self.step.copies_in.remove((cpu - self.base, gpu))
            self.num_loaded -= 1

    def take_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The copies queued since the last call, ``(gpu, cpu)`` out and ``(cpu, gpu)`` in; unpins."""
        out, into = self.copies_out, self.copies_in
        self.copies_out, self.copies_in = [], []
        self.pinned.clear()
        return out, into

    def take_stats(self, gpu_cached_blocks: int) -> KVOffloadStats:
        """The step's :class:`KVOffloadStats`, and a fresh record for the next step."""
        stats, self.step = self.step, KVOffloadStats(cpu_capacity=self.num_blocks)
        stats.gpu_cached_blocks, stats.cpu_blocks = gpu_cached_blocks, len(self.entries)
        stats.cpu_held = sorted(cpu - self.base for cpu in self.entries.values())
        return stats
