"""The prefix cache as the app draws it: the radix tree with each node's text, the blocks a step
evicted, and what each admitted request found cached (``StepReport.radix_tree`` and
``StepReport.prefix_matches``; :mod:`engine.report` has the records).

Plain data built from the cache and the step's events after the step: the engine decodes the
tokens (the cache holds ids only), so the app needs no tokenizer, and the simulator records none.
"""

from __future__ import annotations

from bisect import bisect_left

from engine.core.kv_offload import LOADED_BACK
from engine.core.radix_cache import RadixCache
from engine.report import CACHE_HIT, EVICT, Event, PrefixMatch, RadixNodeView, RadixTreeView


class PrefixReporter:
    """Builds the prefix-cache records of each step.

    Args:
        cache: the engine's prefix cache (``PagedBlockManager.prefix_cache``); a radix tree gives a
            :class:`RadixTreeView` per step, the hash chain none.
        decode: token ids -> text (the engine's tokenizer).
        block_size: tokens per block.
    """

    def __init__(self, cache, decode, block_size: int):
        self.cache, self.decode, self.block_size = cache, decode, block_size
        self._clock_after_step: list[int] = []  # the tree's logical clock after each step: last_access -> step
        self._previous: dict[int, tuple[RadixNodeView, int]] = {}  # block -> (its node after the last step, index in it)
        self._texts: dict[tuple[int, ...], str] = {}

    def radix_tree(self, events: list[Event]) -> RadixTreeView | None:
        """The tree after the step whose events are ``events`` (call once per step, in order)."""
        if not isinstance(self.cache, RadixCache):
            return None
        self._clock_after_step.append(self.cache.clock)
        nodes = [RadixNodeView(node_id=n.node_id, parent_id=n.parent.node_id, token_ids=list(n.key), text=self._text(n.key),
                               blocks=list(n.blocks), lock_ref=n.lock_ref,
                               last_access_step=bisect_left(self._clock_after_step, n.last_access))
                 for n in self.cache.nodes()]
        view = RadixTreeView(nodes=nodes, evicted=self._evicted(events))
        self._previous = {b: (n, i) for n in nodes for i, b in enumerate(n.blocks)}
        return view

    def _evicted(self, events: list[Event]) -> list[RadixNodeView]:
        """The step's EVICT events' blocks, grouped by the node that held them after the last step."""
        groups: dict[int, tuple[RadixNodeView, list[int]]] = {}
        for e in events:
            if e.kind == EVICT and e.block_id in self._previous:
                node, index = self._previous[e.block_id]
                groups.setdefault(node.node_id, (node, []))[1].append(index)
        bs, out = self.block_size, []
        for node, indices in groups.values():
            indices.sort()
            tokens = [t for i in indices for t in node.token_ids[i * bs : (i + 1) * bs]]
            out.append(RadixNodeView(node_id=node.node_id, parent_id=node.parent_id, token_ids=tokens, text=self._text(tokens),
                                     blocks=[node.blocks[i] for i in indices], lock_ref=0, last_access_step=node.last_access_step))
        return out

    def matches(self, events: list[Event], prompts: dict[int, list[int]]) -> dict[int, PrefixMatch]:
        """Per request id with CACHE_HIT events in ``events`` (its first sequence's), what it found;
        ``prompts``: request id -> its prompt token ids."""
        hits: dict[int, list[int]] = {}  # request -> [GPU hits, CPU-tier loads]
        first_seq: dict[int, int | None] = {}
        for e in events:
            if e.kind == CACHE_HIT and first_seq.setdefault(e.request_id, e.seq_id) == e.seq_id:
                hits.setdefault(e.request_id, [0, 0])[bool(e.detail and e.detail.startswith(LOADED_BACK))] += 1
        out = {}
        for rid, (gpu, cpu) in hits.items():
            ids = prompts.get(rid)
            if ids is None:
                continue
            b = min((gpu + cpu) * self.block_size, len(ids))  # a recompute's hit may reach into its output
            a = min(gpu * self.block_size, b)
            out[rid] = PrefixMatch(num_cached_tokens=b, num_loaded_tokens=b - a, num_prompt_tokens=len(ids),
                                   cached_text=self.decode(ids[:a]), loaded_text=self.decode(ids[a:b]), rest_text=self.decode(ids[b:]))
        return out

    def _text(self, token_ids: list[int]) -> str:
        key = tuple(token_ids)
        text = self._texts.get(key)
        if text is None:
            if len(self._texts) > 4096:
                self._texts.clear()
            text = self._texts[key] = self.decode(list(key))
        return text
