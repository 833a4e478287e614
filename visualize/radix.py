"""The prefix cache beside the pool, as HTML: the radix tree (SGLang's RadixAttention) with each
node's text, blocks, lock count and last access, the path a step evicted; the CPU tier as a strip of
blocks with the step's offloads and loads; and a request's prompt with the prefix it found cached.

Plain data in (``StepReport.radix_tree``, ``.kv_offload``, ``.prefix_matches``), HTML strings out:
no chart library, so a step redraws in milliseconds, and the text is the page's own (large on a
projector, readable by a browser test).
"""

from __future__ import annotations

import html

from engine.core.kv_offload import KVOffloadStats
from engine.report import PrefixMatch, RadixNodeView, RadixTreeView
from visualize.i18n import t

MAX_NODES = 60  # nodes drawn before "n more" (a classroom's tree can grow large)
LOCKED, EVICTABLE, EVICTED = "#2e7d32", "#9e9e9e", "#c62828"  # node borders: held by a request, evictable, evicted this step
CACHED_BG, LOADED_BG = "#c8e6c9", "#bbdefb"  # a prompt's prefix found on the GPU, loaded back from the CPU tier


def visible(text: str) -> str:
    """Token text with its whitespace made visible: a newline as ⏎, so a node's edge reads as one line."""
    return text.replace("\n", "⏎")


def shorten(text: str, head: int = 36, tail: int = 20) -> str:
    return text if len(text) <= head + tail + 1 else f"{text[:head]}…{text[-tail:]}"


def radix_tree_html(tree: RadixTreeView, lang: str = "en", large: bool = False) -> str:
    """The tree from its root, each node indented under its parent: its text (decoded tokens), its
    blocks, its lock count and the step of its last access. A node held by a running request
    (lock count > 0) is green; an evictable one grey; the blocks evicted this step hang where
    they were, red and struck through."""
    children: dict[int, list[RadixNodeView]] = {}
    ids = {n.node_id for n in tree.nodes}
    for n in tree.nodes:
        children.setdefault(n.parent_id, []).append(n)
    ghosts: dict[int, list[RadixNodeView]] = {}  # under a live node
    gone = {n.node_id for n in tree.evicted if n.node_id not in ids}  # nodes evicted whole this step
    ghost_children: dict[int, list[RadixNodeView]] = {}  # under a node evicted whole: the subtree keeps its shape
    for n in reversed(tree.evicted):  # evicted leaf first: reversed, a parent comes before its children
        if n.node_id in ids:  # under what is left of its node
            ghosts.setdefault(n.node_id, []).append(n)
        elif n.parent_id in gone:
            ghost_children.setdefault(n.parent_id, []).append(n)
        else:  # under its parent, else the root
            ghosts.setdefault(n.parent_id if n.parent_id in ids else 0, []).append(n)
    font = 20 if large else 14
    out = [f'<div data-testid="radix-tree" style="font-size:{font}px;line-height:1.35">',
           f'<div style="font-weight:600">{html.escape(t("radix_root", lang))}</div>']
    drawn = 0
    stack: list[tuple[RadixNodeView, int, bool]] = [(n, 1, False) for n in reversed(ghosts.get(0, []))]
    stack += [(n, 1, True) for n in reversed(children.get(0, []))]
    while stack:
        node, depth, alive = stack.pop()
        if drawn == MAX_NODES:
            out.append(f'<div>{html.escape(t("radix_more", lang, n=len(stack) + 1))}</div>')
            break
        drawn += 1
        out.append(_node_html(node, depth, alive, lang, font))
        if alive:
            stack += [(g, depth + 1, False) for g in reversed(ghosts.get(node.node_id, []))]
            stack += [(c, depth + 1, True) for c in reversed(children.get(node.node_id, []))]
        else:
            stack += [(g, depth + 1, False) for g in reversed(ghost_children.pop(node.node_id, []))]
    out.append("</div>")
    return "".join(out)


def _node_html(node: RadixNodeView, depth: int, alive: bool, lang: str, font: int) -> str:
    color = EVICTED if not alive else LOCKED if node.lock_ref else EVICTABLE
    style = "dashed" if not alive else "solid"
    text = visible(node.text)
    blocks = ", ".join(map(str, node.blocks))
    meta = (t("radix_evicted_meta", lang, blocks=blocks) if not alive else
            t("radix_node_meta", lang, blocks=blocks, lock=node.lock_ref, step=node.last_access_step))
    strike = "text-decoration:line-through;" if not alive else ""
    return (f'<div data-testid="{"radix-node" if alive else "radix-evicted"}" data-node-id="{node.node_id}" '
            f'data-lock-ref="{node.lock_ref}" data-blocks="{" ".join(map(str, node.blocks))}" '
            f'style="margin:3px 0 3px {(depth - 1) * font}px;padding:2px 6px;border:2px {style} {color};border-radius:4px" '
            f'title="{html.escape(text)}">'
            f'<span data-testid="radix-node-text" style="{strike}font-family:monospace;white-space:pre">{html.escape(shorten(text))}</span>'
            f'<br><small style="color:{color}" data-testid="radix-node-meta">{html.escape(meta)}</small></div>')


def cpu_tier_html(stats: KVOffloadStats, lang: str = "en", large: bool = False) -> str:
    """The CPU tier as a strip of blocks beside the GPU pool: a block holding offloaded KV is filled,
    a free one empty; this step's offloads are marked ↓ with the GPU block they came from, its loads
    ↑ with the GPU block they went to."""
    into = {cpu: gpu for gpu, cpu in stats.copies_out}
    out_of = {cpu: gpu for cpu, gpu in stats.copies_in}
    held = set(stats.cpu_held)
    size = 44 if large else 30
    cells = []
    for b in range(stats.cpu_capacity):
        state = "loaded" if b in out_of else "offloaded" if b in into else "held" if b in held else "empty"
        mark = f"↑{out_of[b]}" if b in out_of else f"↓{into[b]}" if b in into else ""
        tip = t(f"cpu_tier_{state}", lang, block=b, gpu=out_of.get(b, into.get(b)))
        bg = {"loaded": LOADED_BG, "offloaded": CACHED_BG, "held": "#e0e0e0", "empty": "#ffffff"}[state]
        border = {"loaded": "#1565c0", "offloaded": LOCKED}.get(state, "#9e9e9e")
        cells.append(f'<div data-testid="cpu-tier-block" data-block="{b}" data-state="{state}" title="{html.escape(tip)}" '
                     f'style="width:{size}px;height:{size}px;border:2px solid {border};background:{bg};border-radius:3px;'
                     f'display:flex;flex-direction:column;align-items:center;justify-content:center;font-size:{size * 0.36:.0f}px">'
                     f'<span style="color:#555">{b}</span><b data-testid="cpu-tier-mark">{mark}</b></div>')
    moves = [t("cpu_tier_move_out", lang, gpu=g, cpu=c) for g, c in stats.copies_out]
    moves += [t("cpu_tier_move_in", lang, gpu=g, cpu=c) for c, g in stats.copies_in]
    caption = t("sep_list", lang).join(moves) if moves else t("cpu_tier_no_moves", lang)
    return (f'<div data-testid="cpu-tier"><div style="display:flex;flex-wrap:wrap;gap:3px">{"".join(cells)}</div>'
            f'<small data-testid="cpu-tier-moves">{html.escape(caption)}</small></div>')


def prefix_match_html(match: PrefixMatch, lang: str = "en") -> str:
    """A prompt as the model saw it (chat template included) with the prefix it found cached
    highlighted: green on the GPU, blue loaded back from the CPU tier; the rest was computed (after a
    recompute preemption the re-prefill covers the output so far too, and the label says so)."""
    def part(kind: str, text: str, bg: str | None) -> str:
        style = f"background:{bg};" if bg else "color:#888;"
        return f'<span data-testid="prefix-match-{kind}" style="{style}white-space:pre-wrap">{html.escape(shorten(visible(text), 80, 40))}</span>'

    label = t("prefix_match_label_recompute" if match.recompute else "prefix_match_label", lang, cached=match.num_cached_tokens,
              total=match.num_prompt_tokens)
    if match.num_loaded_tokens:
        label += t("prefix_match_loaded", lang, loaded=match.num_loaded_tokens)
    return (f'<div data-testid="prefix-match" data-cached="{match.num_cached_tokens}" data-loaded="{match.num_loaded_tokens}">'
            f'<small>{html.escape(label)}</small><br>{part("cached", match.cached_text, CACHED_BG)}'
            f'{part("loaded", match.loaded_text, LOADED_BG) if match.loaded_text else ""}{part("rest", match.rest_text, None)}</div>')


def latest_matches(reports: list) -> dict[int, PrefixMatch]:
    """Per request id, the match of its latest admission with a cache hit in ``reports``."""
    out: dict[int, PrefixMatch] = {}
    for report in reports:
        out.update(getattr(report, "prefix_matches", None) or {})
    return out
