"""Beside real vLLM, a page of its own: a replay file (``python -m engine replay --against vllm W.json
--json``, or one recorded in tests/data) and the lab's engine on the same workload, step by step:
running requests, KV cache usage and cumulative preemptions of both runs side by side (engine/vllm_bridge/replay.py
gives the data). The page says whether vLLM is set up here (engine/vllm_bridge/env.py) and how to set it up."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import streamlit as st

from app_pages.common import plain
from app_pages.widgets import json_uploader
from engine.vllm_bridge import env as vllm_env
from engine.vllm_bridge.replay import load_replay, replay_lab_run, run_metrics, workload_file
from engine.runfile import load_workload
from engine.vllm_bridge.compare import compare_outputs
from visualize.i18n import error_text, t
from visualize.side_by_side import cumulative, step_series_spec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "tests" / "data"
MEASURES = (  # (step key, chart title key, y axis key, scale)
    ("num_running", "vllm_running_title", "vllm_running_axis", 1),
    ("kv_cache_usage", "vllm_kv_title", "vllm_kv_axis", 100),
)


def examples() -> dict[str, Path]:
    """The recorded replays, by file name."""
    return {p.name: p for p in sorted(EXAMPLES.glob("vllm_replay_*.json"))}


def page() -> None:
    lang = st.session_state["lang"]
    st.title(t("page_vllm", lang))
    vllm_status(lang)
    vllm_comparison(lang)


def vllm_status(lang: str) -> None:
    """Whether vLLM's environment exists here (``python -m engine vllm setup`` builds it), and if not why
    or how; cheap (a file check and /proc/cpuinfo), so it runs on every rerun."""
    python = vllm_env.venv_python()
    if python.exists():
        st.success(t("vllm_status_ready", lang, python=python))
        return
    reason = vllm_env.why_not_supported()
    if reason:
        st.info(t("vllm_status_unsupported", lang, reason=reason))
    else:
        st.info(t("vllm_status_missing", lang, path=vllm_env.venv_dir()))


def vllm_comparison(lang: str) -> None:
    st.caption(t("vllm_intro", lang))
    c = st.columns(2)
    upload = json_uploader(c[0], t("vllm_upload", lang), "vllm_upload", lang)
    found = examples()
    example = c[1].selectbox(t("vllm_example", lang), list(found), key="vllm_example", disabled=upload is not None)
    if upload is not None:
        source, name = upload.getvalue(), upload.name
    elif example is not None:
        source, name = found[example].read_bytes(), example
    else:
        return
    try:
        replay = load_replay(source, name)
    except ValueError as error:
        c[0].error(t("vllm_bad_file", lang, error=plain(error)))
        return
    lab = lab_run(replay, source, lang)
    if lab is not None:
        show(replay, lab, lang)


def lab_run(replay: dict, source: bytes, lang: str) -> dict | None:
    """The lab's side: the file's own engine run, or the engine run here on the replay's workload (on request)."""
    if "engine_run" in replay:
        st.caption(t("vllm_lab_from_file", lang))
        return replay["engine_run"]
    workload_bytes, workload_name = _workload_file(replay, lang)
    if workload_bytes is None:
        return None
    key = hashlib.sha256(source + b"\0" + workload_bytes).hexdigest()
    runs = st.session_state.setdefault("vllm_lab_runs", {})
    if key not in runs:
        if not st.button(t("vllm_run_lab", lang), type="primary", key="btn_vllm_lab"):
            st.info(t("vllm_run_hint", lang))
            return None
        try:
            workload = load_workload(workload_bytes, workload_name)
            with st.spinner(t("vllm_running_lab", lang, n=len(workload.requests))):
                runs[key] = replay_lab_run(replay, workload)
        except Exception as error:  # a bad workload, a model that does not load: said here, page still usable
            st.error(t("error_engine", lang, error=plain(error_text(error, lang))))
            return None
    return runs[key]


def _workload_file(replay: dict, lang: str) -> tuple[bytes | None, str]:
    """The replay's workload: the file it names (relative to the project), or one the reader opens."""
    named, path = replay.get("workload"), workload_file(replay)  # only a recorded workload: a file never names a server path
    if path is not None:
        return path.read_bytes(), path.name
    if named:
        st.warning(t("vllm_workload_missing", lang, path=plain(named)))
    upload = json_uploader(st, t("vllm_workload_upload", lang), "vllm_workload_upload", lang)
    return (upload.getvalue(), upload.name) if upload is not None else (None, "")


def show(replay: dict, lab: dict, lang: str) -> None:
    settings, vllm = replay["settings"], replay["vllm_run"]
    sides = {t("vllm_side_lab", lang): lab, t("vllm_side_vllm", lang, version=replay.get("vllm_version", "")).strip(): vllm}
    st.caption(t("vllm_settings_line", lang, requests=len(vllm["token_ids"]), block_size=settings["block_size"],
                 blocks=settings["num_gpu_blocks"], max_num_seqs=settings.get("max_num_seqs", "-"),
                 ignore_eos=t("yes" if settings["ignore_eos"] else "no", lang)))
    if len(lab["token_ids"]) == len(vllm["token_ids"]):
        outputs = compare_outputs(lab["token_ids"], vllm["token_ids"])
        st.markdown(t("vllm_identical", lang, same=outputs["num_identical"], total=outputs["num_requests"]))
    metrics = {label: run_metrics(run["steps"]) for label, run in sides.items()}
    rows = {t("vllm_m_steps", lang): "num_steps", t("vllm_m_preemptions", lang): "num_preemptions",
            t("vllm_m_peak", lang): "peak_kv_usage", t("vllm_m_mean", lang): "mean_kv_usage"}
    table = pd.DataFrame({label: [_cell(key, m[key]) for key in rows.values()] for label, m in metrics.items()}, index=list(rows))
    st.table(table.rename_axis(t("vllm_metric", lang)))
    for key, title, y_title, scale in MEASURES:
        series = {label: [s[key] * scale for s in run["steps"]] for label, run in sides.items()}
        spec = step_series_spec(series, t(title, lang), t(y_title, lang), t("step_axis", lang), counts=scale == 1)
        st.vega_lite_chart(spec, width="stretch", height=260, key=f"vllm_{key}")
    # Per step, vLLM's counter and the lab's count different moments; their running totals compare.
    series = {label: cumulative([s["num_preempted"] for s in run["steps"]]) for label, run in sides.items()}
    spec = step_series_spec(series, t("vllm_preempt_title", lang), t("vllm_preempt_axis", lang), t("step_axis", lang), counts=True)
    st.vega_lite_chart(spec, width="stretch", height=260, key="vllm_num_preempted")
    st.caption(t("vllm_preempt_note", lang))


def _cell(key: str, value) -> str:
    return f"{value:.1%}" if key.endswith("kv_usage") else str(value)
