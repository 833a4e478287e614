"""One colour per request, the same everywhere: its text, its blocks, its block table, its events.

Every request colour is readable as text on white, on a projector too: a contrast ratio of at least
3:1 (WCAG's for bold text and graphics; pastels such as tab20's light half have 1.5-2:1), and the block
numbers drawn in dark grey on it stay legible. The first nine are Tableau's 10 categorical colours
(greys out), the too-light ones darkened; the other nine are further hues at the same strength, each at
least 15 CIELAB units from every other, so two requests never look alike. Free memory is grey; the
memory categories of the paper's Figure 2 have fixed colours of their own.
"""

from __future__ import annotations

PALETTE = (
    "#1f77b4", "#e8590c", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#d6338f", "#808000", "#0e8a96",
    "#4655c4", "#b36b00", "#1b9e77", "#a5243d", "#7a3fa0", "#5b8c1a", "#c9503a", "#2f6f8f", "#b24fc4",
)  # no grey, which would look like a free block
FREE_COLOR = "#e6e6e6"  # a free block
EDGE_COLOR = "#555555"  # block borders
TOUCHED_COLOR = "#000000"  # border of a block allocated, written or freed this step
CACHED_COLOR = "#8fd3c7"  # prefix caching: a free block that still holds cached KV (evictable)
HIT_COLOR = "#00695c"  # prefix caching: the dot on a block a prompt found cached this step
EVICT_COLOR = "#b71c1c"  # prefix caching: the cross on a cached block evicted this step
COW_COLOR = "#c2185b"  # copy-on-write this step: its source (dashed) and its new copy (solid)
SHARED_COLOR = "#37474f"  # sharing: a block with refcount > 1, a dotted border and its "×n" badge
# How each is drawn, the same in the block tables, the pool map, their legend and the PNG exports:
# (colour, CSS border style, Vega-Lite strokeDash, matplotlib linestyle).
SHARED_BORDER = (SHARED_COLOR, "dotted", [2, 2], ":")
COW_SRC_BORDER = (COW_COLOR, "dashed", [4, 2], "--")
COW_DST_BORDER = (COW_COLOR, "solid", [1, 0], "-")
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
