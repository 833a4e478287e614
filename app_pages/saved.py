"""Save and open: the workload with its settings, or a whole run, as JSON files (engine/runfile.py).

A saved run opens without the model: the Live engine page then replays its step reports.
"""

from __future__ import annotations

from dataclasses import asdict

import pandas as pd
import streamlit as st

from app_pages.classroom_link import session_clients
from app_pages.common import MAX_UPLOAD_MB, plain
from app_pages.state import MAX_BLOCKS, Settings
from app_pages.widgets import json_uploader
from engine.model_executor.model_loader import DEFAULT_MODEL
from engine.runfile import Run, RunFileError, Workload, WorkloadRequest, load_any, run_json, workload_json
from visualize.i18n import t

BLOCK_SIZES = (1, 2, 4, 8, 16, 32)


def current_workload(settings: Settings, rows: list[tuple[str, int]]) -> Workload:
    return Workload([WorkloadRequest(p, n) for p, n in rows], asdict(settings))


def save_and_open(settings: Settings, rows: list[tuple[str, int]], lang: str) -> None:
    """The workload download and the uploader that opens a workload or a run (in the workload panel)."""
    st.download_button(t("save_workload", lang), workload_json(current_workload(settings, rows)),
                       file_name="workload.json", mime="application/json", key="dl_workload")
    json_uploader(st, t("open_file", lang), "upload", lang, on_change=_opened, args=(lang,), help=t("open_file_help", lang))
    error = st.session_state.get("upload_error")
    if error:
        st.error(error)
    note = st.session_state.get("upload_note")
    if note:
        st.warning(t(note[0], lang, model=plain(note[1]), current=plain(note[2])))


def save_run_button(llm, prompts: dict[int, str], reports: list, lang: str) -> None:
    """Download the whole run so far (drawn with the steps, so it is there as soon as a step is)."""
    from app_pages.common import workload_rows

    engine = dict(model_name=llm.model_name, block_size=llm.config.block_size, num_blocks=llm.num_blocks,
                  bytes_per_slot=llm.bytes_per_slot)
    workload = current_workload(st.session_state["settings"], workload_rows())
    st.download_button(t("save_run", lang), lambda: run_json(Run(workload, engine, prompts, reports)),
                       file_name=f"run_{len(reports)}_steps.json", mime="application/json", key="dl_run")


def _opened(lang: str) -> None:
    """Uploader callback (runs before the script, so it may set the sidebar's widgets)."""
    state = st.session_state
    file = state.get("upload")
    state["upload_error"] = state["upload_note"] = None
    if file is None:
        return
    try:
        raw = file.getvalue()
        if len(raw) > MAX_UPLOAD_MB << 20:  # the server's cap too (app_pages.common.serving_problem); said here if not
            raise RunFileError(f"{file.name}: too large ({len(raw):,} bytes; at most {MAX_UPLOAD_MB} MB)")
        opened = load_any(raw, name=file.name)
    except RunFileError as error:
        state["upload_error"] = open_error(error, lang)
        return
    if isinstance(opened, Run):
        state["loaded_run"], state["loaded_run_name"] = opened, file.name
        state["loaded_run_clients"] = session_clients(raw)  # a classroom session's names, if any
        state["replay_at"] = None
        return
    apply_workload(opened)


def open_error(error: Exception, lang: str) -> str:
    """The line shown when a file cannot be opened; the error quotes the file, so it is shown as text."""
    return t("open_failed", lang, error=plain(error))


def apply_workload(workload: Workload) -> None:
    """Put a workload's requests in the editor and its settings in the sidebar's widgets."""
    state, s = st.session_state, workload.settings
    state["workload_df"] = pd.DataFrame([(r.prompt, r.max_tokens) for r in workload.requests], columns=["prompt", "max_tokens"])
    state["editor_version"] = state.get("editor_version", 0) + 1
    # A file is data: it never chooses a server path or a hub id for the server to load (or download).
    # The model stays the one the sidebar has; a file naming another is told so.
    state["upload_note"] = None
    if s["model"] != DEFAULT_MODEL:
        current = state.get("model_path") if state.get("model_choice") == "local" else None
        state["upload_note"] = ("open_model_kept", s["model"], current or DEFAULT_MODEL)
    if s["block_size"] in BLOCK_SIZES:
        state["block_size"] = s["block_size"]
    if s["kv_cache_memory"] is not None:
        state["pool_unit"] = state["pool_unit_shown"] = "mib"
        state["pool_mib"] = round(s["kv_cache_memory"] / (1 << 20), 2)
    else:
        state["pool_unit"] = state["pool_unit_shown"] = "blocks"
        state["num_blocks"] = min(max(int(s["num_gpu_blocks"] or 64), 2), MAX_BLOCKS)
    state["allocator"] = s["allocator"]
    state["reservation"] = s["reservation"]
    state["backend"] = s["attention_backend"] if s["attention_backend"] in ("torch", "triton") else "torch"
    state["max_batch"] = min(max(s["max_num_seqs"], 1), 16)
    state["sample"] = s["temperature"] > 0
    if s["temperature"] > 0:
        state["temperature"] = min(max(round(s["temperature"], 1), 0.1), 1.5)
    state["seed"] = s["seed"]
    state["preemption_mode"] = s.get("preemption_mode", "recompute")  # version-1 files may lack it
    state["chunked_prefill"] = bool(s.get("enable_chunked_prefill", False))
    if s.get("enable_prefix_caching") is not None:  # None: the sidebar keeps the engine's default
        state["prefix_caching"] = s["enable_prefix_caching"]
    if s.get("max_num_batched_tokens"):
        state["token_budget"] = int(s["max_num_batched_tokens"])
    state["speculative"] = bool(s.get("num_speculative_tokens"))
    if s.get("num_speculative_tokens"):
        state["spec_k"] = min(int(s["num_speculative_tokens"]), 8)


def close_run() -> None:
    for key in ("loaded_run", "loaded_run_name", "loaded_run_clients", "replay_at"):
        st.session_state.pop(key, None)
