"""The Live engine page's view of swap preemption and chunked prefill (paper §4.5; vLLM's
enable_chunked_prefill): this step's swapped blocks marked on the GPU pool, the CPU swap space as a
second, smaller pool map, the three queues, and a progress bar per chunked prompt.

Everything is drawn from the step's report through ``visualize/swap.py``; live.py calls these with a
line each.
"""

from __future__ import annotations

import streamlit as st

from visualize.i18n import t
from visualize.swap import cpu_pool_map_spec, gpu_swap_spec, prefill_progress, queues

def mark_swaps(spec: dict, report, lang: str) -> dict:
    """The GPU pool map with the blocks swapped out or in this step outlined."""
    return gpu_swap_spec(spec, report, lang)


def request_ids_text(ids: list[int], lang: str) -> str:
    """"request ids 3, 4" (not a count), or "empty"."""
    if not ids:
        return t("queue_empty", lang)
    return t("queue_request_ids" if len(ids) > 1 else "queue_request_id", lang, ids=t("sep_list", lang).join(map(str, ids)))


def queues_caption(report, views, lang: str) -> None:
    """Waiting, running and (with a swap space) swapped request ids, one line under the GPU pool."""
    q = queues(report, [v.request_id for v in views], {v.request_id for v in views if v.status == "finished"})
    text = t("queues_line", lang, waiting=request_ids_text(q["waiting"], lang), running=request_ids_text(q["running"], lang))
    if report.cpu_memory is not None:
        text += t("queues_swapped", lang, swapped=request_ids_text(q["swapped"], lang))
    st.caption(text)


def cpu_lane(report, block_size: int, lang: str, large: bool = False) -> None:
    """The CPU swap space's pool map (only when the engine has one), with the step's copies."""
    spec = cpu_pool_map_spec(report, block_size, lang)
    if spec is None:
        return
    st.markdown(f"**{t('cpu_pool', lang)}**")
    if large:
        spec["height"] *= 2
    st.vega_lite_chart(spec, width="stretch")
    st.caption(t("cpu_pool_caption", lang, out=len(report.blocks_to_swap_out), inn=len(report.blocks_to_swap_in),
                 ms=report.timings_ms.get("swap", 0.0)))


def prefill_bars(reports: list, at: int, lang: str) -> None:
    """A progress bar per prompt being prefilled in chunks at step ``at`` (computed / total tokens)."""
    rows = prefill_progress(reports[at], reports[at - 1] if at > 0 else None)
    if not rows:
        return
    st.markdown(f"**{t('prefill_progress', lang)}**")
    for row in rows:
        st.progress(row["fraction"], text=t("prefill_progress_bar", lang, request=row["request_id"], computed=row["computed"],
                                            total=row["total"], chunk=row["chunk"]))
