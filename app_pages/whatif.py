"""What-ifs at production scale: a real model on a real GPU, before any engine runs.

Only wiring: the figures are ``engine.sim.whatif.what_if``'s (formulas and simulator runs), the charts
``visualize.whatif``'s.
"""

from __future__ import annotations

import time

import streamlit as st

from app_pages.widgets import localized_choice
from engine.config import KV_CACHE_DTYPES
from engine.sim.disagg import DEFAULT_LINK, LINKS, SLO, unloaded
from engine.sim.whatif import (DISAGG_CHOICES, DTYPE_BYTES, GIB, GPUS, MODELS, SYSTEMS, TENSOR_PARALLEL_SIZES, THIS_CPU, WEIGHT_DTYPES,
                               WhatIfConfig, goodput_of, instance_of, tensor_parallel_problem, what_if)
from visualize.i18n import t
from visualize.whatif import decode_roofline_spec, deployment_name, goodput_spec, system_name, systems_spec

BLOCK_SIZES = (8, 16, 32, 64, 128)
PAPER_SLOTS = 15_700  # PagedAttention Table 1: OPT-13B on one A100-40GB


@st.cache_data(max_entries=256, show_spinner=False)
def _what_if(cfg: WhatIfConfig):
    return what_if(cfg)


def _kept(widget, label: str, key: str, lang: str, default, clamp=None, **kwargs):
    """``widget`` whose value survives a language switch (its label changes) and is kept inside
    ``clamp(value)`` when other choices move its range."""
    state = st.session_state
    value = state.get(key, default)
    if clamp is not None:
        value = clamp(value)
    widget_key = f"{key}__{lang}"
    state[widget_key] = value

    def remember() -> None:
        state[key] = state[widget_key]

    chosen = widget(label, key=widget_key, on_change=remember, **kwargs)
    state[key] = chosen
    return chosen


def _gpu_name(key: str, lang: str) -> str:
    return t("whatif_this_cpu", lang) if key == THIS_CPU else GPUS[key].name


def _count(n: float) -> str:
    return f"{n / 1e9:.4g}B" if n >= 1e9 else f"{n / 1e6:.4g}M"


def _source(url: str) -> str:
    return f"[config.json]({url})" if url.endswith("config.json") else (f"<{url}>" if url.startswith("http") else f"`{url}`")


def controls(lang: str) -> tuple[WhatIfConfig, str]:
    c = st.columns(4)
    model = localized_choice(c[0].selectbox, t("whatif_model", lang), tuple(MODELS), "whatif_model", lang,
                             lambda k: MODELS[k].name, default="llama-3-8b")
    gpu = localized_choice(c[1].selectbox, t("whatif_gpu", lang), tuple(GPUS), "whatif_gpu", lang,
                           lambda k: _gpu_name(k, lang), default="h100")
    dtype = localized_choice(c[2].selectbox, t("whatif_dtype", lang), tuple(DTYPE_BYTES), "whatif_dtype", lang, str)
    system = localized_choice(c[3].selectbox, t("whatif_allocator", lang), SYSTEMS, "whatif_system", lang,
                              lambda s: system_name(s, lang))
    limit = MODELS[model].max_position_embeddings
    contexts = sorted({2**i for i in range(9, 17) if 2**i <= limit} | {limit})
    c = st.columns(3)
    context = _kept(c[0].select_slider, t("whatif_context", lang), "whatif_context", lang, 4096, options=contexts,
                    clamp=lambda v: v if v in contexts else min(contexts, key=lambda x: abs(x - v)))
    prompt = _kept(c[1].slider, t("whatif_prompt", lang), "whatif_prompt", lang, 512, min_value=1, max_value=context - 16,
                   clamp=lambda v: min(v, context - 16))  # room for an output slider of 1..16 at least
    output = _kept(c[2].slider, t("whatif_output", lang), "whatif_output", lang, 256, min_value=1, max_value=context - prompt,
                   clamp=lambda v: min(v, context - prompt))
    c = st.columns(4)
    users = _kept(c[0].slider, t("whatif_users", lang), "whatif_users", lang, 1000, min_value=1, max_value=4000)
    block = _kept(c[1].select_slider, t("block_size", lang), "whatif_block", lang, 16, options=BLOCK_SIZES)
    util = _kept(c[2].slider, "gpu_memory_utilization", "whatif_util", lang, 0.9, min_value=0.5, max_value=1.0, step=0.05)
    kv_dtype = localized_choice(c[3].selectbox, t("whatif_kv_cache_dtype", lang), KV_CACHE_DTYPES, "whatif_kv_cache_dtype", lang, str)
    c = st.columns(4)
    sizes = tuple(n for n in TENSOR_PARALLEL_SIZES if not tensor_parallel_problem(MODELS[model], n))  # the model's heads split evenly
    tp = localized_choice(c[0].selectbox, t("whatif_tp", lang), sizes, "whatif_tp", lang, str, help=t("whatif_tp_help", lang))
    weights = localized_choice(c[1].selectbox, t("whatif_weight_dtype", lang), tuple(WEIGHT_DTYPES), "whatif_weight_dtype", lang,
                               lambda w: t("whatif_weight_auto", lang) if w == "auto" else w, help=t("whatif_weight_dtype_help", lang))
    return WhatIfConfig(model, gpu, dtype, context, users, prompt, output, block, util, kv_cache_dtype=kv_dtype,
                        tensor_parallel_size=tp, weight_dtype=weights), system


def page() -> None:
    lang = st.session_state["lang"]
    st.title(t("page_whatif", lang))
    st.caption(t("whatif_intro", lang))
    try:
        cfg, system = controls(lang)
    except ValueError as error:
        st.error(t("whatif_bad_input", lang, error=error))
        return
    started = time.perf_counter()
    result = _what_if(cfg)
    model, gpu = result.model, result.gpu
    st.caption(t("whatif_model_source", lang, model=model.name, layers=model.num_layers, kv_heads=model.num_kv_heads,
                 head_dim=model.head_dim, params=_count(model.num_params), source=_source(model.source)))
    token_s = result.cost_model["token_s"]  # one GPU's share of a token's FLOPs / its peak FLOP/s
    st.caption(t("whatif_gpu_source", lang, gpu=_gpu_name(gpu.key, lang), memory=gpu.memory_bytes / GIB,
                 bandwidth=gpu.mem_bandwidth / 1e9, tflops=2 * model.num_params / cfg.tensor_parallel_size / token_s / 1e12,
                 dtype=cfg.dtype, source=_source(gpu.source)))
    formula = formulas(result, lang)
    none = t("whatif_kv_memory_none", lang)
    m = st.columns(4)
    for box, (label, value, key) in zip(m, (("whatif_weights", f"{result.weight_bytes / GIB:,.2f} GiB", "weights"),
                                            ("whatif_kv_per_token", f"{result.kv_bytes_per_token:,} B", "kv"),
                                            ("whatif_kv_memory", f"{result.kv_memory_bytes / GIB:,.2f} GiB" if result.kv_memory_bytes > 0
                                             else none, "memory"),
                                            ("whatif_kv_slots", f"{result.kv_slots:,}", "slots"))):
        box.metric(t(label, lang), value, help=t("whatif_from_formula", lang, formula=formula[key]))
    st.caption(" · ".join(f"{t(k, lang)} {t('whatif_from_formula', lang, formula=formula[f])}"
                          for k, f in (("whatif_weights", "weights"), ("whatif_kv_per_token", "kv"), ("whatif_kv_memory", "memory"))))
    if not result.fits:
        st.error(not_fit_text(result, lang))
        return
    chosen = result.system(system)
    m = st.columns(4)
    m[0].metric(t("whatif_fit", lang), f"{chosen.requests_fit:,}", help=t("whatif_fit_formula", lang, slots=f"{result.kv_slots:,}",
                per_request=f"{chosen.slots_per_request:,}", system=system_name(system, lang)))
    ridge = ridge_text(result, lang)
    m[1].metric(t("whatif_ridge", lang), f"{result.ridge_batch:,}" if result.ridge_batch else t("whatif_ridge_never", lang), help=ridge)
    m[2].metric(t("whatif_throughput", lang), f"{chosen.sim_tokens_per_s:,.0f}")
    m[3].metric(t("whatif_rate", lang), f"{chosen.sim_requests_per_s:,.2f}",
                help=t("whatif_rate_help", lang))
    st.caption(t("whatif_fit_formula", lang, slots=f"{result.kv_slots:,}", per_request=f"{chosen.slots_per_request:,}",
                 system=system_name(system, lang)) + " · " + f"{t('whatif_ridge', lang)} {ridge}" + " · "
               + t("whatif_rate_formula", lang, tokens=chosen.sim_tokens_per_s, running=chosen.sim_mean_running,
                   preemptions=chosen.sim_preemptions))
    st.vega_lite_chart(systems_spec(result, lang))
    st.vega_lite_chart(decode_roofline_spec(result, lang), width="stretch", height=320)
    st.markdown(t("whatif_explain", lang))
    for note in notes(result, lang):
        st.markdown(note)
    st.caption(t("whatif_sim_source", lang, n=result.sim_num_requests, ms=1e3 * result.sim_wall_s,
                 call=result.formulas["simulate"], command=result.command))
    st.caption(t("whatif_assumptions", lang))
    check = _what_if(WhatIfConfig("opt-13b", "a100-40gb", "float16", 2048, 1, 161, 338))
    st.caption(t("whatif_paper_check", lang, gib=check.kv_memory_bytes / 2**30, slots=check.kv_slots,
                 diff=check.kv_slots / PAPER_SLOTS - 1))
    st.caption(t("whatif_timing", lang, ms=1e3 * (time.perf_counter() - started)))
    goodput_section(cfg, lang)


@st.cache_data(max_entries=64, show_spinner=False)
def _goodput(cfg: WhatIfConfig, disagg: str, ttft_scale: float, tpot_scale: float, target: float, link: str) -> dict:
    alone = unloaded(instance_of(cfg), cfg.prompt_len, cfg.output_len)
    slo = SLO(ttft_scale * alone["ttft_s"], tpot_scale * alone["tpot_s"], target)
    return goodput_of(cfg, disagg, slo, link)


def goodput_section(cfg: WhatIfConfig, lang: str) -> None:
    """DistServe's goodput of xPyD against as many colocated GPUs (``engine.sim.whatif.goodput_of``)."""
    st.subheader(t("goodput_heading", lang))
    st.caption(t("goodput_intro", lang))
    c = st.columns(5)
    disagg = localized_choice(c[0].selectbox, t("goodput_deployment", lang), DISAGG_CHOICES, "goodput_disagg", lang, str,
                              help=t("goodput_deployment_help", lang))
    link = localized_choice(c[1].selectbox, t("goodput_link", lang), tuple(LINKS), "goodput_link", lang,
                            lambda k: t(f"goodput_link_{k}", lang, gbs=LINKS[k] / 1e9), default=DEFAULT_LINK)
    ttft_scale = _kept(c[2].slider, t("goodput_ttft_scale", lang), "goodput_ttft_scale", lang, 10.0, min_value=1.5, max_value=50.0, step=0.5)
    tpot_scale = _kept(c[3].slider, t("goodput_tpot_scale", lang), "goodput_tpot_scale", lang, 1.5, min_value=1.05, max_value=5.0, step=0.05)
    target = _kept(c[4].slider, t("goodput_target", lang), "goodput_target", lang, 90, min_value=50, max_value=99)
    if cfg.output_len < 2:
        st.info(t("goodput_needs_two_tokens", lang))
        return
    result = _goodput(cfg, disagg, ttft_scale, tpot_scale, target / 100, link)
    m = st.columns(3)
    for box, row in zip(m, result["deployments"]):
        value = t("goodput_value", lang, rate=row["goodput"]) if row["goodput"] else t("goodput_below_sweep", lang)
        box.metric(t("goodput_of", lang, label=deployment_name(row, lang), gpus=row["gpus"]), value,
                   t("goodput_per_gpu", lang, rate=row["goodput_per_gpu"]), delta_color="off")
    transfer = t("goodput_transfer_formula", lang, kv=result["kv_bytes_per_token"], prompt=cfg.prompt_len,
                 gbs=result["link_bandwidth"] / 1e9, ms=result["transfer_ms"])
    m[2].metric(t("goodput_transfer", lang), f"{result['transfer_ms']:.2f} ms", help=transfer)
    slo, alone = result["slo"], result["unloaded"]
    st.caption(t("goodput_slos", lang, ttft_scale=ttft_scale, ttft_alone=1e3 * alone["ttft_s"], ttft=1e3 * slo["ttft_s"],
                 tpot_scale=tpot_scale, tpot_alone=1e3 * alone["tpot_s"], tpot=1e3 * slo["tpot_s"], target=slo["target"])
               + " · " + t("goodput_transfer_caption", lang, formula=transfer))
    st.vega_lite_chart(goodput_spec(result, lang), width="stretch", height=320)
    st.caption(t("goodput_source", lang, ms=1e3 * result["wall_s"], n=result["num_requests"],
                 command=result["command"]))
    st.caption(t("goodput_not_modelled", lang))


def formulas(result, lang: str) -> dict[str, str]:
    """Each of the four memory figures' formula, with this what-if's numbers (GiB throughout)."""
    cfg, model, gpu, tp = result.config, result.model, result.gpu, result.config.tensor_parallel_size
    sizes = dict(params=_count(model.num_params), nbytes=f"{cfg.weight_bytes_per_param:g}", gib=f"{result.weight_bytes / GIB:,.2f}")
    shape = dict(layers=model.num_layers, head_dim=model.head_dim, nbytes=cfg.kv_dtype_bytes)
    memory = dict(util=f"{cfg.gpu_memory_utilization:g}", memory=f"{gpu.memory_bytes / GIB:.2f}",
                  weights=f"{result.weight_bytes_per_gpu / GIB:,.2f}", kv=f"{result.kv_memory_bytes / GIB:,.2f}")
    if tp == 1:
        return {"weights": t("whatif_weights_formula", lang, **sizes),
                "kv": t("whatif_kv_formula", lang, kv_heads=model.num_kv_heads, **shape),
                "memory": t("whatif_memory_formula", lang, **memory), "slots": t("whatif_slots_formula", lang)}
    return {"weights": t("whatif_weights_formula_tp", lang, tp=tp, per_gpu=f"{result.weight_bytes_per_gpu / GIB:,.2f}", **sizes),
            "kv": t("whatif_kv_formula_tp", lang, kv_heads=cfg.kv_heads_per_gpu, tp=tp, **shape),
            "memory": t("whatif_memory_formula_tp", lang, tp=tp, **memory), "slots": t("whatif_slots_formula", lang)}


def ridge_text(result, lang: str) -> str:
    """Where the ridge point comes from, with this what-if's numbers, or why there is none."""
    r = result.ridge
    terms = dict(compute=1e6 * r["compute_s"], kv=1e6 * r["kv_s"], context=r["context"])
    if result.ridge_batch is None:
        return t("whatif_ridge_never_formula", lang, ceiling=1 / r["kv_s"], **terms)
    return t("whatif_ridge_formula", lang, weights=1e3 * r["weights_s"], balance=r["intensity_balance"], **terms)


def not_fit_text(result, lang: str) -> str:
    """Why nothing fits (the weights alone, or not one request of max_model_len), and what would."""
    cfg, gpu = result.config, result.gpu
    names = {"tensor_parallel_size": lambda n: t("whatif_fix_tp", lang, n=n, gpu=_gpu_name(gpu.key, lang)),
             "weight_dtype": lambda w: t("whatif_fix_weights", lang, dtype=w),
             "gpu": lambda g: t("whatif_fix_gpu", lang, gpu=_gpu_name(g, lang))}
    choices = [names[k](v) for k, v in result.would_fit.items()]
    fixes = t("whatif_would_fit", lang, choices=t("sep_list", lang).join(choices)) if choices else t("whatif_would_fit_none", lang)
    if result.kv_memory_bytes_per_gpu > 0:
        return t("whatif_no_room", lang, kv=result.kv_memory_bytes / GIB, slots=result.kv_slots, context=cfg.max_model_len, fixes=fixes)
    budget = cfg.gpu_memory_utilization * gpu.memory_bytes
    return t("whatif_not_fit", lang, model=result.model.name, weights=result.weight_bytes_per_gpu / GIB, budget=budget / GIB,
             util=cfg.gpu_memory_utilization, gpu=_gpu_name(gpu.key, lang), memory=gpu.memory_bytes / GIB,
             kv=result.kv_memory_bytes_per_gpu / GIB, fixes=fixes)


def notes(result, lang: str) -> list[str]:
    """What this what-if's own numbers would hide: a power-of-two output (Pow2 then reserves what Oracle does),
    and a paged run that beats Oracle by admitting more than fit and preempting."""
    cfg, found = result.config, []
    if cfg.output_len & (cfg.output_len - 1) == 0:
        found.append(t("whatif_pow2_is_oracle", lang, output=cfg.output_len))
    paged, oracle = result.system("paged"), result.system("oracle")
    if paged.sim_preemptions and paged.sim_requests_per_s > oracle.sim_requests_per_s:
        found.append(t("whatif_paged_overadmits", lang, running=paged.sim_mean_running, fit=paged.requests_fit,
                       preemptions=paged.sim_preemptions))
    return found
