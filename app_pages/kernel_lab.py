"""Kernel lab: the Triton PagedAttention decode kernel on the last step's real queries, caches and block tables.

Where the query comes from: during every step, a forward hook (app_pages/state.install_capture) keeps
each layer's q_proj output and the attention output the engine computed. For every request
scheduled in the last step we take the row of its newest token, apply the model's own RoPE
(and Qwen3's q_norm), and run the kernel over that layer's K/V pools through the request's block
table with its context length from the step. The newest token attends to the whole context,
exactly as in a decode step (for a prefill it is the prompt's last token).
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st
import torch

from app_pages.common import png_download
from engine.model_executor.attention import paged_attention_reference
from engine.model_executor.model import apply_rotary
from visualize.i18n import t
from visualize.kernel import program_grid, program_grid_figure


def kernel_inputs(llm, report, layer: int):
    """(request_ids, query [n, heads, dim], engine attention [n, heads, dim], block_tables int32, context_lens int32)
    for the sequences of ``report`` whose request still holds its blocks (one row per sample or beam),
    or None if there are none. The block tables and context lengths are those the step's attention read."""
    captured = getattr(llm, "captured", {})
    if "q" not in captured.get(layer, {}) or "tables" not in captured:
        return None
    live = {s.request_id for s in report.block_tables}
    attn_layer = llm.runner.model.model.layers[layer].self_attn
    prefill_tables, prefill_lens, decode_tables, decode_lens = captured["tables"]
    all_tables = [row for t in (prefill_tables, decode_tables) for row in t.tolist()]
    all_lens = prefill_lens.tolist() + decode_lens.tolist()
    if len(all_lens) != len(report.scheduled):  # the tables of another step (this one ran no model)
        return None
    rows, ids, lens, tables, end = [], [], [], [], 0
    for i, s in enumerate(report.scheduled):  # prefills first, then decodes: the model's flat batch, one entry per sequence
        end += s.num_tokens
        if s.request_id in live:
            rows.append(end - 1)  # this sequence's newest token
            ids.append(s.request_id)
            lens.append(all_lens[i])
            tables.append(all_tables[i])
    if not rows:
        return None
    heads, dim = attn_layer.num_heads, attn_layer.head_dim
    q = captured[layer]["q"][rows].view(len(rows), heads, dim)
    if hasattr(attn_layer, "q_norm"):
        q = attn_layer.q_norm(q)
    positions = torch.tensor([n - 1 for n in lens], device=q.device)
    cos, sin = llm.runner.model.rotary_emb(positions, q.dtype)
    query = apply_rotary(q, cos, sin).contiguous()
    engine_out = captured[layer]["attn"][rows].view(len(rows), heads, dim)
    width = max(len(tb) for tb in tables)
    block_tables = torch.tensor([tb + [0] * (width - len(tb)) for tb in tables], dtype=torch.int32, device=q.device)
    context_lens = torch.tensor(lens, dtype=torch.int32, device=q.device)
    return ids, query, engine_out, block_tables, context_lens


def page() -> None:
    lang = st.session_state["lang"]
    st.title(t("page_kernel", lang))
    st.caption(t("kernel_intro", lang))
    llm, reports = st.session_state.get("engine"), st.session_state.get("reports", [])
    if llm is None or not reports:
        st.info(t("kernel_need_step", lang))
        return
    model = llm.runner.model
    c = st.columns([1, 1, 2])
    layer = int(c[0].number_input(t("layer", lang), 0, model.num_layers - 1, 0, key="kernel_layer"))
    splits = int(c[1].selectbox(t("num_splits", lang), (1, 2, 4), key="kernel_splits"))
    inputs = kernel_inputs(llm, reports[-1], layer)
    if inputs is None:
        st.info(t("kernel_no_rows", lang))
        return
    ids, query, engine_out, block_tables, context_lens = inputs
    key_cache, value_cache = llm.runner.caches_for(llm.kv.attention_block_size)[layer]
    block_size = llm.kv.attention_block_size
    scale = model.model.layers[layer].self_attn.scale
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
         t("token_range", lang): f"{p['start']}–{p['end']}", t("physical_blocks", lang): ", ".join(map(str, p["blocks"]))}
        for p in programs
    ])
    st.dataframe(table, hide_index=True, width="stretch", height=min(38 + 35 * len(table), 300))

    if st.button(t("run_kernel", lang), type="primary", key="btn_kernel"):
        run_kernel(query, key_cache, value_cache, block_tables, context_lens, scale, splits, engine_out, lang)


def run_kernel(query, key_cache, value_cache, block_tables, context_lens, scale, splits, engine_out, lang) -> None:
    import kernels  # sets the Triton interpreter on a machine without a GPU; imported only here

    with torch.inference_mode():
        kernels.paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale, num_splits=splits)  # warm-up (compile)
        t0 = time.perf_counter()
        out = kernels.paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale, num_splits=splits)
        t1 = time.perf_counter()
        ref = paged_attention_reference(query, key_cache, value_cache, block_tables, context_lens, scale)
        t2 = time.perf_counter()
    c = st.columns(4)
    c[0].metric(t("max_diff_ref", lang), f"{(out - ref).abs().max().item():.2e}", help=t("max_diff_ref_help", lang))
    c[1].metric(t("max_diff_engine", lang), f"{(out - engine_out).abs().max().item():.2e}", help=t("max_diff_engine_help", lang))
    c[2].metric(t("kernel_time", lang), f"{1e3 * (t1 - t0):.1f} ms")
    c[3].metric(t("reference_time", lang), f"{1e3 * (t2 - t1):.1f} ms")
    if kernels.interpreted():
        from kernels.paged_attention_decode import INTERPRETER_PAIRS

        st.caption(t("interpreter_note", lang, pairs=INTERPRETER_PAIRS))
