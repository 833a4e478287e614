"""One colour per request, the same everywhere: its text, its blocks, its block table, its events.

The palette is Tableau's 10 categorical colours followed by their light variants (matplotlib's
``tab20`` reordered, greys left out), so neighbouring request ids never look alike. Free memory is grey; the
memory categories of the paper's Figure 2 have fixed colours of their own.
"""

from __future__ import annotations

PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf",
    "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5",
)  # tab20 without its two greys, which would look like free blocks
FREE_COLOR = "#e6e6e6"  # a free block
EDGE_COLOR = "#555555"  # block borders
TOUCHED_COLOR = "#000000"  # border of a block allocated, written or freed this step
CACHED_COLOR = "#8fd3c7"  # prefix caching: a free block that still holds cached KV (evictable)
HIT_COLOR = "#00695c"  # prefix caching: the dot on a block a prompt found cached this step
EVICT_COLOR = "#b71c1c"  # prefix caching: the cross on a cached block evicted this step
COW_COLOR = "#c2185b"  # sharing: the refcount badge and a copy-on-write's source and copy
ROLLBACK_COLOR = "#e65100"  # speculative decoding: the outline of lookahead slots given back at rollback

# Figure 2 categories (engine/core/accounting.py): useful memory green, waste in warm colours, free grey.
CATEGORY_COLORS = {
    "token_states": "#2ca02c",
    "reserved": "#1f77b4",
    "internal_fragmentation": "#ff7f0e",
    "external_fragmentation": "#d62728",
    "free": "#d9d9d9",
}


def request_color(request_id: int | None) -> str:
    """Hex colour of a request (None: free memory)."""
    if request_id is None:
        return FREE_COLOR
    return PALETTE[request_id % len(PALETTE)]
