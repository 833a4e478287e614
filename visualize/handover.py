"""A prefill/decode handover drawn from :class:`engine.disagg_pair.PairState`: both instances' pools
and block tables, and every request's handover (which prefill block went to which decode block, the
bytes, the milliseconds, the lease). Rows first (plain dicts a test reads), then HTML.

A request keeps one colour and one number on both sides: the proxy's, the prefill instance's
request id (the decode instance numbers its requests on its own).
"""

from __future__ import annotations

import html

from engine.disagg_pair import PairState, PoolState
from visualize.colors import EDGE_COLOR, FREE_COLOR, TOUCHED_COLOR, request_color
from visualize.i18n import t

LENT_PATTERN = "repeating-linear-gradient(45deg, {c}, {c} 4px, #ffffff 4px, #ffffff 7px)"  # a lent block: striped
LOADING_BORDER = f"2px dashed {EDGE_COLOR}"  # allocated, its KV not yet arrived


def request_numbers(state: PairState) -> dict[int, int]:
    """Decode request id -> the proxy's request number (the prefill instance's id) for handed-over requests."""
    return {h.decode_request_id: h.prefill_request_id for h in state.handovers if h.decode_request_id is not None}


def moved_blocks(state: PairState) -> tuple[set[int], set[int]]:
    """The prefill blocks read and the decode blocks they went to, in the step just taken."""
    moves = [m for h in state.handovers if h.read_at_step == state.step for m in h.moves]
    return {p for p, _ in moves}, {d for _, d in moves}


def pool_rows(pool: PoolState, numbers: dict[int, int] | None = None) -> list[dict]:
    """One row per physical block: ``block``, ``request`` (the proxy's number, None when free) and
    ``state`` ("free", "running", "lent", "loading", "loaded")."""
    numbers = numbers or {}
    rows = []
    for b in range(pool.num_blocks):
        rid, why = pool.holders.get(b, (None, "free"))
        rows.append(dict(block=b, request=None if rid is None else numbers.get(rid, rid), state=why))
    return rows


def handover_rows(state: PairState, lang: str = "en") -> list[dict]:
    """One row per handover, newest last, in the reader's language: request, lease (its id shortened)
    and lease state (pull), or bootstrap room and SGLang's ``KVPoll`` state (push), blocks moved
    ("prefill → decode"), blocks the decode instance found in its own prefix cache (not read), bytes,
    ms, and the decode instance's load state."""
    rows = []
    for h in state.handovers:
        push = h.bootstrap_room is not None
        rows.append({
            t("request", lang): h.prefill_request_id,
            **({t("ho_room", lang): short_id(str(h.bootstrap_room)), t("ho_poll", lang): h.poll} if push else
               {t("ho_lease", lang): short_id(h.transfer_id), t("ho_lease_state", lang): t(f"ho_lease_{h.lease}", lang)}),
            t("ho_moves", lang): " ".join(f"{p}→{d}" for p, d in h.moves) or "–",
            t("ho_num_blocks", lang): len(h.moves),
            t("ho_decode_hits", lang): h.first_block if h.decode_blocks else "–",
            t("ho_bytes", lang): _bytes(h.num_bytes) if h.num_bytes else "–",
            t("ho_write_ms" if push else "ho_copy_ms", lang): f"{h.copy_ms:.1f}" if h.copy_ms is not None else "–",
            **({} if push else {t("ho_read_ms", lang): f"{h.read_ms:.1f}" if h.read_ms is not None else "–"}),
            t("ho_load", lang): t(f"ho_load_{h.load}", lang),
        })
    return rows


def short_id(transfer_id: str) -> str:
    """A lease's id (or a room's) as shown: its first 6 characters (the whole 192-bit id is what reads the blocks)."""
    return transfer_id[:6] + "…"


def _bytes(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


# ---- HTML ---------------------------------------------------------------------------------------


def pool_html(pool: PoolState, lang: str, numbers: dict[int, int] | None = None, moved: set[int] = frozenset(),
              columns: int = 16) -> str:
    """The pool as a grid of cells, ``columns`` blocks a row, each with its block id and a tooltip:
    a request's colour (striped: lent; dashed border: its KV being read in, or reserved for it), a black border on the
    blocks ``moved`` this step. Each cell is ``data-testid="ho-block"`` with ``data-block``,
    ``data-request`` and ``data-state``."""
    cells = []
    for row in pool_rows(pool, numbers):
        rid, state = row["request"], row["state"]
        color = FREE_COLOR if rid is None else request_color(rid)
        background = LENT_PATTERN.format(c=color) if state == "lent" else color
        border = (f"3px solid {TOUCHED_COLOR}" if row["block"] in moved else LOADING_BORDER if state in ("loading", "reserved")
                  else f"1px solid {EDGE_COLOR}")
        who = t("free", lang) if rid is None else f'{t("request", lang)} {rid} · {t(f"ho_state_{state}", lang)}'
        tip = html.escape(f'{t("block", lang)} {row["block"]}{t("sep_colon", lang)}{who}')
        cells.append(f'<span data-testid="ho-block" data-block="{row["block"]}" data-request="{"" if rid is None else rid}" '
                     f'data-state="{state}" title="{tip}" '
                     f'style="box-sizing:border-box;height:24px;border:{border};background:{background};font-size:11px;'
                     f'line-height:20px;text-align:center;color:#222">{_label(row["block"], rid is not None)}</span>')
    return (f'<div data-testid="ho-pool" data-role="{pool.role}" style="display:grid;grid-template-columns:repeat({columns}, 1fr);'
            f'gap:2px;max-width:{columns * 40}px">{"".join(cells)}</div>')


def _label(block: int, held: bool) -> str:
    """A block's number, on a white patch where the cell is coloured or striped (legible on any request colour)."""
    return f'<span style="background:#ffffffd9;padding:0 2px;border-radius:2px">{block}</span>' if held else str(block)


def block_tables_html(pool: PoolState, lang: str, numbers: dict[int, int] | None = None) -> str:
    """Each request's block table on this instance: logical order, physical block ids, and why it holds them."""
    numbers = numbers or {}
    if not pool.block_tables:
        return f'<div data-testid="ho-tables" data-role="{pool.role}"><small style="color:#888">{t("ho_no_tables", lang)}</small></div>'
    rows = []
    for rid, (blocks, why) in sorted(pool.block_tables.items()):
        n = numbers.get(rid, rid)
        color = request_color(n)
        cells = "".join(f'<span data-testid="ho-table-cell" title="{t("logical_index", lang)} {i} → {t("block", lang)} {b}" '
                        f'style="display:inline-block;min-width:26px;margin:1px;padding:0 2px;border:1px solid {EDGE_COLOR};'
                        f'font-size:11px;text-align:center;background:{color}33">{b}</span>' for i, b in enumerate(blocks))
        rows.append(f'<div data-testid="ho-table" data-request="{n}"><b style="color:{color}">{t("request", lang)} {n}</b> '
                    f'<small style="color:#666">· {t(f"ho_state_{why}", lang)}</small>{t("sep_colon", lang)}{cells}</div>')
    return f'<div data-testid="ho-tables" data-role="{pool.role}">{"".join(rows)}</div>'


def legend_html(lang: str, order: str = "pull") -> str:
    def box(style: str) -> str:
        return f'<span style="display:inline-block;width:18px;height:12px;vertical-align:middle;{style}"></span>'

    c = request_color(0)
    waiting = [] if order == "push" else [(box(f"background:{LENT_PATTERN.format(c=c)};border:1px solid {EDGE_COLOR}"), t("ho_state_lent", lang))]
    items = [(box(f"background:{c};border:1px solid {EDGE_COLOR}"), t("ho_state_running", lang)), *waiting,
             (box(f"background:{c};border:{LOADING_BORDER}"), t("ho_state_reserved" if order == "push" else "ho_state_loading", lang)),
             (box(f"background:{FREE_COLOR};border:3px solid {TOUCHED_COLOR}"), t("ho_legend_moved", lang))]
    return ('<div data-testid="ho-legend" style="font-size:0.8rem;color:#555">'
            + " &nbsp; ".join(f"{mark} {html.escape(text)}" for mark, text in items) + "</div>")


def handover_table_html(state: PairState, lang: str) -> str:
    """:func:`handover_rows` as an HTML table (``data-testid="ho-row"`` per handover)."""
    rows = handover_rows(state, lang)
    if not rows:
        return f'<small style="color:#888">{t("ho_none_yet", lang)}</small>'
    head = "".join(f'<th style="white-space:nowrap">{html.escape(k)}</th>' for k in rows[0])
    body = "".join(f'<tr data-testid="ho-row" data-request="{h.prefill_request_id}">'
                   + "".join(f"<td>{html.escape(str(v))}</td>" for v in row.values()) + "</tr>"
                   for h, row in zip(state.handovers, rows))
    return f'<table data-testid="ho-transfers" style="font-size:0.85rem;width:100%"><tr>{head}</tr>{body}</table>'


ORDER_STEPS = {"pull": ("ho_pull_1", "ho_pull_2", "ho_pull_3", "ho_pull_4"),
               "push": ("ho_push_1", "ho_push_2", "ho_push_3", "ho_push_4")}


def order_steps(order: str, lang: str) -> list[str]:
    """How one request is handed over in ``order`` ("pull" or "push"), its steps in the order they happen."""
    return [t(key, lang) for key in ORDER_STEPS[order]]


def order_steps_html(order: str, lang: str) -> str:
    """:func:`order_steps` as an ordered list (``data-testid="ho-order-step"`` per step)."""
    items = "".join(f'<li data-testid="ho-order-step">{html.escape(text)}</li>' for text in order_steps(order, lang))
    return f'<ol data-testid="ho-order" data-order="{order}" style="font-size:0.9rem">{items}</ol>'


def story(state: PairState, lang: str) -> list[str]:
    """What the step just taken did to each handover, one sentence each (plain text)."""
    lines = []
    for h in state.handovers:
        n = h.prefill_request_id
        if h.bootstrap_room is not None:
            lines += _push_story(h, state.step, lang)
            continue
        if h.lent_at_step == state.step:
            lines.append(t("ho_story_lent", lang, rid=n, n=len(h.prefill_blocks), lease=short_id(h.transfer_id)))
        if h.read_at_step == state.step:
            lines.append(t("ho_story_read", lang, rid=n, n=len(h.moves), size=_bytes(h.num_bytes),
                           ms=f"{h.read_ms:.1f}" if h.read_ms is not None else "–"))
        if h.ended_at_step == state.step:
            lines.append(t(f"ho_story_{h.load}", lang, rid=n))
    return lines


def _push_story(h, step: int, lang: str) -> list[str]:
    n, lines = h.prefill_request_id, []
    if h.reserved_at_step == step:
        lines.append(t("ho_story_reserved", lang, rid=n, n=len(h.decode_blocks) - h.first_block, room=short_id(str(h.bootstrap_room))))
    if h.read_at_step == step:
        lines.append(t("ho_story_written", lang, rid=n, n=len(h.moves), size=_bytes(h.num_bytes),
                       ms=f"{h.copy_ms:.1f}" if h.copy_ms is not None else "–"))
    if h.ended_at_step == step:
        lines.append(t(f"ho_story_{h.load}", lang, rid=n) if h.load == "loaded" else t("ho_story_push_failed", lang, rid=n))
    return lines
