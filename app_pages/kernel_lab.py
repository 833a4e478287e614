"""Kernel lab: the Triton PagedAttention decode kernel on the last step's real queries, caches and block tables.

Where the inputs come from: the session's engine records every step's attention
(``ModelRunner.capture_attention``, kept in the session as ``attention``): per layer, each sequence's
newest token's query (after the model's own RoPE and Qwen3's q_norm), the layer's K/V pools, the
block tables and context lengths attention read, and the attention output the engine computed.
The kernel runs on the rows of the requests that still hold their blocks, one row per sequence (a
sample or a beam reads its own table). The newest token attends to the whole context, exactly as in
a decode step (for a prefill it is the prompt's last token).
"""

from __future__ import annotations

import dataclasses
import time

import pandas as pd
import streamlit as st
import torch

from app_pages.common import png_download
from engine.model_executor.attention import paged_attention_reference
from visualize.i18n import t
from visualize.kernel import program_grid, program_grid_figure


def kernel_inputs(recorder, report, layer: int):
    """(request_ids, CapturedAttention) for the sequences of ``report`` whose request still holds its
    blocks (one row per sample or beam), from ``recorder`` (``ModelRunner.capture_attention()``), or
    None if there are none or the recorder's last step is not ``report``'s (a step that ran no model)."""
    captured = recorder.last(layer) if recorder is not None else None
    if captured is None or not report.scheduled or captured.num_seqs != len(report.scheduled):
        return None
    live = {s.request_id for s in report.block_tables}
    # report.scheduled is the model's flat batch, one entry per sequence: prefills first, then decodes.
    keep = [i for i, s in enumerate(report.scheduled) if s.request_id in live]
    if not keep:
        return None
    rows = torch.tensor(keep, dtype=torch.int64)
    ids = [report.scheduled[i].request_id for i in keep]
    tables = captured.block_tables[rows]
    width = max(1, int((captured.context_lens[rows].max().item() + captured.block_size - 1) // captured.block_size))
    return ids, dataclasses.replace(
        captured, query=captured.query[rows].contiguous(), output=captured.output[rows], block_tables=tables[:, :width].contiguous(),
        context_lens=captured.context_lens[rows].contiguous(), num_prefills=sum(1 for i in keep if i < captured.num_prefills))


def page() -> None:
    lang = st.session_state["lang"]
    st.title(t("page_kernel", lang))
    st.caption(t("kernel_intro", lang))
    import paged_kernels  # sets the Triton interpreter on a machine without a GPU; never fails without Triton

    if paged_kernels.unavailable_reason() is not None:
        st.warning(t("kernel_no_triton", lang), icon=":material/block:")
    llm, reports = st.session_state.get("engine"), st.session_state.get("reports", [])
    if llm is None or not reports or st.session_state.get("attention") is None:
        st.info(t("kernel_need_step", lang))
        return
    recorder = st.session_state.get("attention")
    c = st.columns([1, 1, 2])
    layer = int(c[0].number_input(t("layer", lang), 0, recorder.num_layers - 1, 0, key="kernel_layer"))
    splits = int(c[1].selectbox(t("num_splits", lang), (1, 2, 4), key="kernel_splits"))
    inputs = kernel_inputs(recorder, reports[-1], layer)
    if inputs is None:
        st.info(t("kernel_no_rows", lang))
        return
    ids, captured = inputs
    query, key_cache = captured.query, captured.key_cache
    block_tables, context_lens, block_size = captured.block_tables, captured.context_lens, captured.block_size
    st.caption(f"{t('step_summary', lang, step=reports[-1].step)} · {t('layer', lang)} {layer} · "
               f"query {tuple(query.shape)} · key_cache {tuple(key_cache.shape)} · block_tables {tuple(block_tables.shape)}")

    programs = program_grid(ids, context_lens.tolist(), block_tables.tolist(), block_size,
                            query.shape[1], key_cache.shape[2], splits)
    st.markdown(f"**{t('program_grid', lang)}**")
    st.caption(t("program_grid_caption", lang))
    fig = program_grid_figure(programs, lang)
    st.pyplot(fig, clear_figure=True)
    png_download(t("save_png", lang), lambda: program_grid_figure(programs, lang), "program_grid.png", "png_grid")
    st.markdown(f"**{t('block_reads', lang)}**")
    table = pd.DataFrame([
        {t("program_grid", lang): p["program"], t("request", lang): p["request_id"], t("kv_head", lang): p["kv_head"],
         t("query_heads", lang): ", ".join(map(str, p["query_heads"])), t("partition", lang): p["partition"],
         t("token_range", lang): token_span(p["start"], p["end"], lang), t("physical_blocks", lang): ", ".join(map(str, p["blocks"]))}
        for p in programs
    ])
    st.dataframe(table, hide_index=True, width="stretch", height=min(38 + 35 * len(table), 300))

    if st.button(t("run_kernel", lang), type="primary", key="btn_kernel", disabled=paged_kernels.unavailable_reason() is not None):
        run_kernel(captured, splits, lang)


def token_span(start: int, end: int, lang: str) -> str:
    """A program's half-open token range [start, end) as the positions it reads, first and last
    inclusive, and how many: [0, 39) is "0–38 (39 tokens)"."""
    return t("token_span", lang, first=start, last=end - 1, n=end - start) if end > start else "–"


def run_kernel(captured, splits: int, lang: str) -> None:
    """The Triton decode kernel (and the torch reference) on ``captured`` (a ``CapturedAttention``), timed."""
    import paged_kernels  # sets the Triton interpreter on a machine without a GPU; imported only here

    c = captured
    query, key_cache, value_cache, block_tables, context_lens, scale = (c.query, c.key_cache, c.value_cache, c.block_tables,
                                                                        c.context_lens, c.scale)

    with torch.inference_mode():
        paged_kernels.paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale, num_splits=splits)  # warm-up (compile)
        t0 = time.perf_counter()
        out = paged_kernels.paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale, num_splits=splits)
        t1 = time.perf_counter()
        ref = paged_attention_reference(query, key_cache, value_cache, block_tables, context_lens, scale)
        t2 = time.perf_counter()
    c = st.columns(4)
    c[0].metric(t("max_diff_ref", lang), f"{(out - ref).abs().max().item():.2e}", help=t("max_diff_ref_help", lang))
    c[1].metric(t("max_diff_engine", lang), f"{(out - captured.output).abs().max().item():.2e}", help=t("max_diff_engine_help", lang))
    c[2].metric(t("kernel_time", lang), f"{1e3 * (t1 - t0):.1f} ms")
    c[3].metric(t("reference_time", lang), f"{1e3 * (t2 - t1):.1f} ms")
    if paged_kernels.interpreted():
        from paged_kernels.paged_attention_decode import INTERPRETER_PAIRS

        st.caption(t("interpreter_note", lang, pairs=INTERPRETER_PAIRS))
