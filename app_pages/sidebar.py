"""The sidebar: language switch and engine settings, shared by every page."""

from __future__ import annotations

import math
import os

import streamlit as st

from app_pages.state import MAX_BLOCKS, MAX_MIB, SHARING, Settings, default_model, kv_slot_bytes
from app_pages.widgets import bounded_number, localized_choice
from engine.config import KV_CACHE_DTYPES
from engine.model_executor.model_loader import DEFAULT_MODEL, GEMMA_MODEL
from visualize.i18n import LANGUAGE_NAMES, LANGUAGES, t

MIB = 1 << 20


def language() -> str:
    """The language radio (kept in session_state["lang"]). A session starts in the language of its
    link (``?lang=zh``, as the classroom's join link carries it), on whichever page it opens; the
    link of a page in another language than English says it too, so a reload or a copied address
    keeps it."""
    state, query = st.session_state, st.query_params
    if "lang" not in state:
        asked = query.get("lang")
        state["lang"] = asked if asked in LANGUAGES else LANGUAGES[0]
    lang = st.sidebar.radio("Language / 语言", LANGUAGES, format_func=LANGUAGE_NAMES.get, key="lang", horizontal=True)
    if query.get("lang", LANGUAGES[0]) != lang:
        query["lang"] = lang
    return lang


def student_mode() -> bool:
    """The session came by the classroom's join link (``?mode=student``): it sees the Send page only,
    without the teacher's pages and engine settings, for the rest of the session."""
    state = st.session_state
    if st.query_params.get("mode") == "student":
        state["student_mode"] = True
    return bool(state.get("student_mode"))


LAB_OFF, LAB_CUSTOM = "", "__custom__"


def lab_choice(lang: str) -> str | None:
    """The lab implementation the Live engine steps beside its own parts, and that *Your parts* runs
    (``LAB_IMPL``'s values, ``engine/core/lab_impl.py``): a starter or find-the-bug file of
    ``labs/starters/``, or a student's own file or folder; None: the engine's own parts alone.
    Kept in ``session_state["lab_impl"]`` for the page."""
    from lessons.labs import STARTERS

    options = [LAB_OFF] + [p.stem for p in sorted(STARTERS.glob("*.py"))] + [LAB_CUSTOM]
    names = {LAB_OFF: t("labs_engine", lang), LAB_CUSTOM: t("labs_custom", lang)}
    started_with = os.environ.get("LAB_APP_IMPL", "").strip()  # `LAB_IMPL=labs/mine streamlit run app.py` (app.py)
    if started_with and "labs_impl" not in st.session_state:
        st.session_state["labs_impl"], st.session_state["labs_path"] = LAB_CUSTOM, started_with
    choice = localized_choice(st.sidebar.selectbox, t("labs_impl", lang), options, "labs_impl", lang,
                              lambda o: names.get(o, o), help=t("labs_impl_help", lang))
    impl = None
    if choice == LAB_CUSTOM:
        impl = st.sidebar.text_input(t("labs_path", lang), key="labs_path").strip() or None
    elif choice != LAB_OFF:
        impl = str(STARTERS / f"{choice}.py")
    st.session_state["lab_impl"] = impl
    return impl


def engine_settings(lang: str, sb=None) -> Settings:
    """Every engine knob of the sidebar (or of ``sb``, a container in it), as a :class:`Settings`."""
    sb = sb if sb is not None else st.sidebar
    sb.header(t("settings", lang))
    sb.caption(t("settings_help", lang))
    start = default_model()
    named = {"default": DEFAULT_MODEL, "gemma": GEMMA_MODEL}
    choice = localized_choice(sb.radio, t("model", lang), ("default", "gemma", "local"), "model_choice", lang,
                              lambda c: t(f"model_{c}", lang),
                              default=next((c for c, name in named.items() if name == start), "local"))
    model = named.get(choice, DEFAULT_MODEL)
    if choice == "local":
        st.session_state.setdefault("model_path", "" if start in named.values() else start)
        path = sb.text_input(t("model_path", lang), key="model_path",
                             help=t("model_path_help", lang)).strip()
        model = path or DEFAULT_MODEL
    # Defaults in session_state, not value=: a preset or an opened workload file sets these widgets too.
    for key, default in (("block_size", 16), ("max_batch", 8), ("temperature", 0.7), ("seed", 0)):
        st.session_state.setdefault(key, default)
    block_size = sb.select_slider(t("block_size", lang), options=[1, 2, 4, 8, 16, 32], key="block_size",
                                  help=t("block_size_help", lang))
    kv_dtype = sb.selectbox(t("kv_cache_dtype", lang), KV_CACHE_DTYPES, key="kv_cache_dtype", help=t("kv_cache_dtype_help", lang))
    num_blocks, kv_bytes = pool_size(sb, lang, model, int(block_size), kv_dtype)
    st.session_state["capacity_slot"] = sb.empty()  # filled with the token capacity once the engine exists
    allocator = localized_choice(sb.radio, t("allocator", lang), ("paged", "contiguous"), "allocator", lang,
                                 lambda a: t(f"allocator_{a}", lang))
    reservation, prefix_caching, prefix_options = "max", None, {}
    if allocator == "paged":
        st.session_state.setdefault("prefix_caching", True)
        prefix_caching = sb.toggle(t("prefix_caching", lang), key="prefix_caching", help=t("prefix_caching_help", lang))
        if prefix_caching:
            prefix_options = prefix_cache_settings(sb, lang)
    if allocator == "contiguous":
        reservation = sb.selectbox(t("reservation", lang), ("max", "pow2", "oracle"), key="reservation", help=t("reservation_help", lang))
    backend = sb.radio(t("backend", lang), ("torch", "triton"), horizontal=True, key="backend", help=t("backend_help", lang))
    max_seqs = int(sb.slider(t("max_batch", lang), 1, 16, key="max_batch"))
    scheduling = scheduler_settings(sb, lang, allocator, max_seqs)
    sb.subheader(t("sampling", lang))
    st.session_state.setdefault("sharing", "none")
    st.session_state.setdefault("sharing_width", 4)
    sharing = localized_choice(sb.radio, t("sharing", lang), SHARING, "sharing", lang, lambda m: t(f"sharing_{m}", lang),
                               help=t("sharing_help", lang))
    width = 1
    if sharing != "none":
        width = int(sb.number_input(t(f"sharing_width_{sharing}", lang), min_value=2, max_value=8, key="sharing_width"))
    # Greedy by default (as SamplingParams): the same demo gives the same text every time.
    temperature = 0.0
    if sharing == "beam":  # beams are chosen by cumulative log-probability: no temperature to set
        sb.caption(t("beam_no_temperature", lang))
    elif sb.toggle(t("sample_toggle", lang), key="sample", help=t("sample_toggle_help", lang)):
        temperature = float(sb.slider(t("temperature", lang), 0.1, 1.5, step=0.1, key="temperature"))
    else:
        sb.caption(t("sample_off_greedy", lang))
    seed = int(sb.number_input(t("seed", lang), min_value=0, max_value=2**31 - 1, key="seed"))
    return Settings(model=model, block_size=int(block_size), num_gpu_blocks=num_blocks, kv_cache_memory=kv_bytes,
                    allocator=allocator, reservation=reservation, attention_backend=backend, max_num_seqs=max_seqs,
                    temperature=temperature, seed=seed, sharing=sharing, sharing_width=width,
                    enable_prefix_caching=prefix_caching, kv_cache_dtype=kv_dtype, **prefix_options, **scheduling)


def prefix_cache_settings(sb, lang: str) -> dict:
    """With prefix caching on: the cache (vLLM's hash chain or SGLang's radix tree), the waiting
    queue's order (FCFS or SGLang's longest prefix match) and the CPU tier's size, as Settings fields."""
    state = st.session_state
    state.setdefault("kv_offload_blocks", 0)
    cache = localized_choice(sb.radio, t("prefix_cache_kind", lang), ("hash", "radix"), "prefix_cache", lang,
                             lambda c: t(f"prefix_cache_{c}", lang), horizontal=True, help=t("prefix_cache_kind_help", lang))
    policy = localized_choice(sb.radio, t("scheduling_policy", lang), ("fcfs", "lpm"), "scheduling_policy", lang,
                              lambda p: t(f"scheduling_{p}", lang), horizontal=True, help=t("scheduling_policy_help", lang))
    offload = int(sb.number_input(t("kv_offload_blocks", lang), min_value=0, max_value=256, key="kv_offload_blocks",
                                  help=t("kv_offload_blocks_help", lang)))
    return dict(prefix_cache=cache, scheduling_policy=policy, kv_offload_blocks=offload)


def scheduler_settings(sb, lang: str, allocator: str, max_seqs: int) -> dict:
    """Preemption mode (paper §4.5; swap only with the paged allocator), chunked prefill with its
    token budget (vLLM's enable_chunked_prefill, max_num_batched_tokens) and speculative decoding by
    prompt lookup with its k (paged only), as Settings fields.
    The budget box is kept in [max_seqs, 2048]: every running request decodes a token per step."""
    sb.subheader(t("scheduler", lang))
    state = st.session_state
    mode = "recompute"
    if allocator == "paged":
        mode = localized_choice(sb.radio, t("preemption_mode", lang), ("recompute", "swap"), "preemption_mode", lang,
                                lambda m: t(f"preemption_{m}", lang), horizontal=True, help=t("preemption_mode_help", lang))
    else:
        sb.caption(t("preemption_contiguous_note", lang))
    state.setdefault("chunked_prefill", False)
    state.setdefault("token_budget", 64)
    chunked = sb.toggle(t("chunked_prefill", lang), key="chunked_prefill", help=t("chunked_prefill_help", lang))
    budget = None
    if chunked:
        budget = int(bounded_number(sb, t("token_budget", lang), "token_budget", max_seqs, 2048, lang, step=16,
                                    help=t("token_budget_help", lang)))
    state.setdefault("speculative", False)
    state.setdefault("spec_k", 4)
    k = 0
    if allocator == "paged":
        if sb.toggle(t("speculative", lang), key="speculative", help=t("speculative_help", lang)):
            k = int(sb.slider(t("speculative_k", lang), 1, 8, key="spec_k"))
    else:
        sb.caption(t("speculative_paged_note", lang))
    return dict(preemption_mode=mode, enable_chunked_prefill=bool(chunked), max_num_batched_tokens=budget,
                num_speculative_tokens=k)


def pool_size(sb, lang: str, model: str, block_size: int, kv_cache_dtype: str = "auto") -> tuple[int | None, int | None]:
    """The KV pool's size, in blocks or in MiB (num_gpu_blocks, kv_cache_memory bytes): one is None.

    MiB bounds come from the model and block size (2 blocks up to MAX_BLOCKS), so the box never offers
    a size the engine refuses; switching the unit carries the pool's size over to the other unit.
    """
    state = st.session_state
    # Defaults live in session_state (not in value=) because the presets also set these.
    state.setdefault("pool_unit", "blocks")
    state.setdefault("num_blocks", 64)
    unit = localized_choice(sb.radio, t("pool_unit", lang), ("blocks", "mib"), "pool_unit", lang, lambda u: t(u, lang), horizontal=True)
    block_mib = None
    if unit == "mib" or state.get("pool_unit_shown", unit) != unit:
        slot_bytes = kv_slot_bytes(model, kv_cache_dtype)
        block_mib = slot_bytes * block_size / MIB if slot_bytes else None
    if block_mib is None and unit == "mib":  # the model cannot be read: its error shows on the page
        unit = "blocks"
    if block_mib and state.get("pool_unit_shown", unit) != unit:  # the unit was switched: same pool size
        if unit == "mib":
            # Rounded up to the box's 0.01 MiB, so that the MiB hold the same whole blocks (7 x 0.70 MiB
            # = 4.92 would give 6 blocks back); at most the box's maximum.
            top = math.floor(min(MAX_MIB, MAX_BLOCKS * block_mib) * 100) / 100
            state["pool_mib"] = min(top, math.ceil(round(state["num_blocks"] * block_mib * 100, 6)) / 100)
        else:
            state["num_blocks"] = int(state.get("pool_mib", 8.0) / block_mib)
    state["pool_unit_shown"] = unit
    if unit == "blocks":
        return int(bounded_number(sb, t("pool_blocks", lang), "num_blocks", 2, MAX_BLOCKS, lang, step=8)), None
    lo = math.ceil(2 * block_mib * 100) / 100
    hi = math.floor(min(MAX_MIB, MAX_BLOCKS * block_mib) * 100) / 100
    state.setdefault("pool_mib", max(lo, min(8.0, hi)))
    mib = bounded_number(sb, t("pool_mib", lang), "pool_mib", lo, hi, lang, step=0.5, format="%.2f",
                         help=t("pool_mib_bounds", lang, lo=f"{lo:.2f}", hi=f"{hi:.2f}", blocks=MAX_BLOCKS))
    return None, int(mib * MIB)


def show_capacity(llm, lang: str) -> None:
    """Under the pool size: how many tokens and MiB the pool really holds (whole blocks)."""
    slot = st.session_state.get("capacity_slot")
    if slot is None or llm is None:
        return
    bs = llm.config.block_size
    mib = llm.num_blocks * bs * llm.bytes_per_slot / (1 << 20)
    if llm.kv_cache_config is not None:  # a hybrid model: a page holds one group's layers, a token needs a slot per group
        text = hybrid_capacity_text(llm.kv_cache_config, llm.num_blocks, bs, llm.bytes_per_slot, lang)
    else:
        text = t("pool_capacity", lang, blocks=llm.num_blocks, block_size=bs, tokens=llm.num_blocks * bs, mib=mib,
                 slot_kib=llm.bytes_per_slot / 1024)
    if llm.config.kv_cache_dtype != "auto":  # the same memory in the model's dtype would hold `ratio` times fewer tokens
        ratio = llm.dtype.itemsize // llm.kv_cache_dtype.itemsize
        in_blocks = llm.config.kv_cache_memory is None  # the pool kept its blocks: the saving shows as fewer MiB
        text += "  \n" + t("pool_capacity_kv_dtype_blocks" if in_blocks else "pool_capacity_kv_dtype", lang,
                           kv_dtype=llm.config.kv_cache_dtype, ratio=ratio, model_dtype=str(llm.dtype).replace("torch.", ""),
                           mib=mib, full_mib=mib * ratio, blocks=llm.num_blocks)
    slot.caption(text)


def hybrid_capacity_text(kv_cache_config, num_blocks: int, block_size: int, bytes_per_slot: int, lang: str) -> str:
    """A hybrid pool's capacity in tokens of context (vLLM v1's hybrid KV cache manager: every group takes
    its pages from one pool of ``num_blocks`` blocks, block 0 the null block). ``bytes_per_slot``: one
    group's slot (its layers' K and V for one token). One token of context costs a slot in every group
    while it is in the sliding window; a request of L tokens then holds ceil(L / block_size) blocks in each
    full-attention group and at most ``sliding_window // block_size + 1`` in each sliding one."""
    groups = kv_cache_config.kv_cache_groups
    usable = num_blocks - 1  # the null block
    sliding = [g.kv_cache_spec.sliding_window for g in groups if g.kv_cache_spec.sliding_window is not None]
    num_full = len(groups) - len(sliding)
    window_blocks = sum(w // block_size + 1 for w in sliding)
    long_tokens = (usable - window_blocks) // max(num_full, 1) * block_size
    return t("pool_capacity_hybrid", lang, blocks=num_blocks, group_layers=max(len(g.layer_names) for g in groups),
             mib=num_blocks * block_size * bytes_per_slot / (1 << 20), token_kib=len(groups) * bytes_per_slot / 1024,
             groups=len(groups), slot_kib=bytes_per_slot / 1024, tokens=f"{usable * block_size // len(groups):,}",
             long_tokens=f"{long_tokens:,}")
