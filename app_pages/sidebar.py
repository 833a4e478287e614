"""The sidebar: language switch and engine settings, shared by every page."""

from __future__ import annotations

import streamlit as st

from app_pages.state import MAX_BLOCKS, MAX_MIB, Settings, default_model
from app_pages.widgets import localized_choice
from engine.model_loader import DEFAULT_MODEL
from visualize.i18n import LANGUAGE_NAMES, LANGUAGES, t


def language() -> str:
    """The language radio (kept in session_state["lang"])."""
    return st.sidebar.radio("Language / 语言", LANGUAGES, format_func=LANGUAGE_NAMES.get, key="lang", horizontal=True)


def engine_settings(lang: str) -> Settings:
    """Every engine knob of the sidebar, as a :class:`Settings`."""
    sb = st.sidebar
    sb.header(t("settings", lang))
    sb.caption(t("settings_help", lang))
    start = default_model()
    choice = localized_choice(sb.radio, t("model", lang), ("default", "local"), "model_choice", lang,
                              lambda c: t("model_default", lang) if c == "default" else t("model_local", lang),
                              default="default" if start == DEFAULT_MODEL else "local")
    model = DEFAULT_MODEL
    if choice == "local":
        path = sb.text_input(t("model_path", lang), value="" if start == DEFAULT_MODEL else start, key="model_path",
                             help=t("model_path_help", lang)).strip()
        model = path or DEFAULT_MODEL
    block_size = sb.select_slider(t("block_size", lang), options=[1, 2, 4, 8, 16, 32], value=16, key="block_size",
                                  help=t("block_size_help", lang))
    # Defaults live in session_state (not in value=) because the presets also set these widgets.
    st.session_state.setdefault("pool_unit", "blocks")
    st.session_state.setdefault("num_blocks", 64)
    unit = localized_choice(sb.radio, t("pool_unit", lang), ("blocks", "mib"), "pool_unit", lang, lambda u: t(u, lang), horizontal=True)
    num_blocks = kv_bytes = None
    if unit == "blocks":
        num_blocks = int(sb.number_input(t("pool_blocks", lang), min_value=2, max_value=MAX_BLOCKS, step=8, key="num_blocks"))
    else:
        kv_bytes = int(sb.number_input(t("pool_mib", lang), min_value=0.5, max_value=float(MAX_MIB), value=8.0, step=1.0, key="pool_mib") * (1 << 20))
    st.session_state["capacity_slot"] = sb.empty()  # filled with the token capacity once the engine exists
    allocator = localized_choice(sb.radio, t("allocator", lang), ("paged", "contiguous"), "allocator", lang,
                                 lambda a: t(f"allocator_{a}", lang))
    reservation = "max"
    if allocator == "contiguous":
        reservation = sb.selectbox(t("reservation", lang), ("max", "pow2", "oracle"), key="reservation", help=t("reservation_help", lang))
    backend = sb.radio(t("backend", lang), ("torch", "triton"), horizontal=True, key="backend", help=t("backend_help", lang))
    max_seqs = int(sb.slider(t("max_batch", lang), 1, 16, 8, key="max_batch"))
    sb.subheader(t("sampling", lang))
    temperature = float(sb.slider(t("temperature", lang), 0.0, 1.5, 0.7, 0.1, key="temperature"))
    seed = int(sb.number_input(t("seed", lang), min_value=0, max_value=2**31 - 1, value=0, key="seed"))
    return Settings(model=model, block_size=int(block_size), num_gpu_blocks=num_blocks, kv_cache_memory=kv_bytes,
                    allocator=allocator, reservation=reservation, attention_backend=backend, max_num_seqs=max_seqs,
                    temperature=temperature, seed=seed)


def show_capacity(llm, lang: str) -> None:
    """Under the pool size: how many tokens and MiB the pool really holds (whole blocks)."""
    slot = st.session_state.get("capacity_slot")
    if slot is None or llm is None:
        return
    bs = llm.config.block_size
    slot.caption(t("pool_capacity", lang, blocks=llm.num_blocks, block_size=bs, tokens=llm.num_blocks * bs,
                   mib=llm.num_blocks * bs * llm.bytes_per_slot / (1 << 20), slot_kib=llm.bytes_per_slot / 1024))
