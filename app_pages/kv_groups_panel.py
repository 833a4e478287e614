"""A hybrid model's KV cache groups on the Live engine page: each group's block tables (a sliding
window's freed entries shown as the null block), the pool coloured by group, and the blocks the
window saved against the same model with all layers full attention (``visualize/kv_groups.py``)."""

from __future__ import annotations

import html

import streamlit as st

from visualize.i18n import t
from visualize.kv_groups import (NULL_COLOR, SAVING_CONTEXTS, group_color, group_label, pool_by_group_spec, window_saving_at,
                                 window_savings_frame, window_savings_spec)


def swatch_html(color: str) -> str:
    """A group's colour as a key beside its name (the name itself stays dark text: pale greens and blues
    are unreadable as text on white)."""
    return (f'<span data-testid="kv-group-swatch" style="display:inline-block;width:12px;height:12px;margin-right:6px;'
            f'vertical-align:middle;border:1px solid #555;background:{color}"></span>')


def table_cells_html(snap, color: str, block_size: int, lang: str, font: int = 10) -> str:
    """One group's block table for one sequence as a row of cells in the group's colour (a partly
    filled block paler); an entry freed out of the sliding window is ∅, the null block 0."""
    return "".join(
        f'<span data-testid="kv-group-cell" title="{t("logical_index", lang)} {i} → {t("block", lang)} {b}" '
        f'style="display:inline-block;min-width:26px;margin:1px;padding:0 2px;border:1px solid #555;font-size:{font}px;'
        f'text-align:center;background:{NULL_COLOR if f == 0 and b == 0 else color}{"" if f == block_size or b == 0 else "80"}">'
        f'{"∅" if b == 0 and f == 0 else b}</span>'
        for i, (b, f) in enumerate(zip(snap.block_table, snap.filled)))


def kv_groups_view(report, reports: list, num_blocks: int, block_size: int, lang: str) -> None:
    """Shown only for a run with several KV cache groups (``StepReport.kv_groups``)."""
    if not report.kv_groups:
        return
    st.markdown(f"**{t('kv_groups', lang)}**")
    st.caption(t("kv_groups_caption", lang))
    for group in report.kv_groups:
        color = group_color(report, group.group_id)
        rows = [f'<div><small>{t("request", lang)} {snap.request_id}</small>{t("sep_colon", lang)}'
                f'{table_cells_html(snap, color, block_size, lang)}</div>' for snap in group.block_tables]
        head = f'{html.escape(group_label(group, lang))} · {t("kv_in_use", lang, n=group.num_blocks_in_use)}'
        st.markdown(f'<div data-testid="kv-group" data-group="{group.group_id}" data-in-use="{group.num_blocks_in_use}">'
                    f'{swatch_html(color)}<b>{head}</b>{"".join(rows)}</div>', unsafe_allow_html=True)
    st.vega_lite_chart(pool_by_group_spec(report, num_blocks, lang), width="stretch")
    frame = window_savings_frame(reports, block_size)
    if len(frame):
        st.vega_lite_chart(window_savings_spec(frame, lang), width="stretch")
        last = frame.iloc[-1]
        short, long = SAVING_CONTEXTS
        st.caption(t("kv_window_saved_caption", lang, in_use=int(last.in_use), all_full=int(last.all_full),
                     saved=int(last.all_full - last.in_use), in_use_mib=last.in_use_mib, all_full_mib=last.all_full_mib,
                     share=1 - last.in_use / max(last.all_full, 1), short=f"{short:,}", long=f"{long:,}",
                     short_ratio=window_saving_at(report, short, block_size), long_ratio=window_saving_at(report, long, block_size)))
