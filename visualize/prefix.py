"""Prefix caching in the views: each request's cached and computed tokens, and a cached block's hash chain.

Plain data from the engine's step reports (and, for the chain, ``PrefixCache.entries()``): a block
hash names the block's tokens and, through its parent's hash, everything before them
(``engine/core/prefix_cache.py``; vLLM's automatic prefix caching).
"""

from __future__ import annotations

from engine.report import CACHE_HIT, EVICT, StepReport
from visualize.i18n import t

HASH_CHARS = 8  # hex digits shown of a 64-digit SHA-256 block hash
MAX_PARENTS = 4  # parents listed in a hover before "… (n more)"

CacheEntries = dict[int, tuple[str, "str | None"]]  # block -> (block hash, parent hash), hex


def cached_and_computed(reports: list[StepReport], block_size: int) -> dict[int, tuple[int, int]]:
    """Per request id, ``(cached, computed)`` tokens over ``reports``.

    cached: prompt tokens served from cached blocks (its CACHE_HIT events x ``block_size``; a
    re-prefill after preemption that hits its own blocks counts too, which vLLM's
    ``RequestOutput.num_cached_tokens`` leaves out). computed: the tokens its steps computed
    (``ScheduledRequest.num_tokens``: prefill, recompute and decode).
    """
    split: dict[int, list[int]] = {}
    for report in reports:
        for e in report.events:
            if e.kind == CACHE_HIT:
                split.setdefault(e.request_id, [0, 0])[0] += block_size
        for s in report.scheduled:
            split.setdefault(s.request_id, [0, 0])[1] += s.num_tokens
    return {rid: (c, n) for rid, (c, n) in split.items()}


def cache_marks(report: StepReport) -> dict[int, str]:
    """Blocks hit ("hit") or evicted ("evict") this step, from its CACHE_HIT and EVICT events."""
    marks = {e.block_id: "evict" for e in report.events if e.kind == EVICT}
    marks.update({e.block_id: "hit" for e in report.events if e.kind == CACHE_HIT})
    return marks


def short_hash(block_hash: str | None) -> str:
    return (block_hash or "")[:HASH_CHARS]


def parent_chain_text(block: int, entries: CacheEntries, lang: str = "en") -> str:
    """The parents of a cached block, nearest first: "block 3 · 9f8e7d6c ← block 1 · 0badf00d ← start of the
    prompt". A parent evicted since is named by its hash only (its block holds other tokens now)."""
    by_hash = {h: b for b, (h, _) in entries.items()}
    parts, parent = [], entries[block][1]
    while parent is not None and len(parts) < MAX_PARENTS:
        owner = by_hash.get(parent)
        if owner is None:
            parts.append(t("hash_parent_evicted", lang, hash=short_hash(parent)))
            break
        parts.append(t("hash_parent", lang, block=owner, hash=short_hash(parent)))
        parent = entries[owner][1]
    else:
        parts.append(t("hash_chain_start", lang) if parent is None else t("hash_chain_more", lang))
    return " ← ".join(parts)
