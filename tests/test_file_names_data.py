"""A file names data, never server paths or models to fetch: replay files (engine/vllm_bridge/replay.py) and workload
files opened in the app (app_pages/saved.py); and ``python -m engine replay`` reads a bounded file."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.vllm_bridge.replay import load_replay, workload_file

DATA = Path(__file__).parent / "data"


def _replay(**changes) -> dict:
    data = json.loads((DATA / "vllm_replay_4x16.json").read_text())
    for key, value in changes.items():
        if key.startswith("settings."):
            data["settings"][key.split(".", 1)[1]] = value
        else:
            data[key] = value
    return data


@pytest.mark.parametrize("named", ["/etc/passwd", "../../../../etc/passwd", "tests/data/../../../etc/hostname",
                                   "tests/data/vllm_replay_4x16.json", "app.py", "..\\..\\workload_x.json", "", None])
def test_a_replay_names_no_server_path(named):
    assert workload_file(_replay(workload=named)) is None


def test_a_replay_names_its_recorded_workload_by_name():
    assert workload_file(_replay()) == DATA / "workload_4x16.json"  # "tests/data/workload_4x16.json" in the file
    assert workload_file(_replay(workload="/somewhere/else/workload_pressure_16x64.json")) == DATA / "workload_pressure_16x64.json"


@pytest.mark.parametrize("model", ["HuggingFaceTB/SmolLM2-1.7B-Instruct", "/etc", "../models/x.gguf"])
def test_a_replay_cannot_choose_the_model(model):
    with pytest.raises(ValueError, match="cannot choose the model this server loads"):
        load_replay(json.dumps(_replay(**{"settings.model": model})), "r.json")
    assert load_replay(json.dumps(_replay(**{"settings.model": None})), "r.json")["settings"]["model"] is None


def test_the_lab_side_of_a_replay_runs_the_default_model(monkeypatch):
    """Even a dict that skipped load_replay's check makes the engine of the default model."""
    from engine.vllm_bridge import replay

    made = {}

    class Stop(Exception):
        pass

    def record(settings):  # what the engine would be built with; building it is not this test's business
        made["settings"] = settings
        raise Stop

    monkeypatch.setattr(replay, "make_engine", record)
    with pytest.raises(Stop):
        replay.replay_lab_run(_replay(**{"settings.model": "evil/model"}), type("W", (), {"requests": [None] * 4})())
    assert made["settings"]["model"] is None


@pytest.mark.parametrize("key, value, message", [
    ("settings.block_size", 10**100, "block_size is 1000000"),
    ("settings.num_gpu_blocks", 10**9, "num_gpu_blocks is 1000000000, not an integer from 1 to 16384"),
    ("settings.num_gpu_blocks", 16384, "a pool of 16384 blocks of 32 slots is over the 16,384 slots"),
    ("settings.kv_cache_memory", 10**15, "kv_cache_memory is 1000000000000000"),
    ("settings.seed", 10**30, "seed is 1000000000000000000000000000000"),
    ("settings.temperature", "hot", "temperature is 'hot'"),
    ("settings.ignore_eos", "yes", "ignore_eos is 'yes'"),
    ("settings.enable_chunked_prefill", 1, "enable_chunked_prefill is 1"),
    ("workload", ["/etc/passwd"], "workload is ['/etc/passwd'], not a file name"),
])
def test_replay_settings_out_of_range_are_refused(key, value, message):
    with pytest.raises(ValueError) as error:
        load_replay(json.dumps(_replay(**{key: value})), "r.json")
    assert str(error.value).startswith("r.json: ") and message in str(error.value)


@pytest.mark.parametrize("raw", [b"[" * 100_000, b'{"settings": ' + b"9" * 5000 + b"}", b'{"x": NaN}', b"\xff\xfe"])
def test_a_replay_that_is_no_json_is_a_value_error(raw):
    with pytest.raises(ValueError, match="x.json is not JSON"):
        load_replay(raw, "x.json")


def _open_workload(raw: bytes):
    import streamlit as st

    from app_pages.saved import apply_workload
    from engine.runfile import load_workload

    if "opened" not in st.session_state:
        st.session_state["opened"] = True
        apply_workload(load_workload(raw, name="w.json"))


@pytest.mark.parametrize("model", ["HuggingFaceTB/SmolLM2-1.7B-Instruct", "/etc/passwd", "~/models/other.gguf"])
def test_a_workload_opened_in_the_app_keeps_the_servers_model(model):
    from app_pages.common import plain
    from visualize.i18n import t

    workload = {"format": "pagedattention-lab/workload", "version": 1, "requests": [{"prompt": "Hi", "max_tokens": 4}],
                "settings": {"model": model, "block_size": 8}}
    at = AppTest.from_function(_open_workload, args=(json.dumps(workload).encode(),), default_timeout=60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    state = at.session_state
    assert "model_choice" not in state and "model_path" not in state  # the sidebar keeps its model
    assert state["block_size"] == 8  # the rest of the file is applied
    key, named, current = state["upload_note"]
    assert named == model and current == "SmolLM2-135M-Instruct"
    assert "keeps its model" in t(key, "en", model=plain(named), current=plain(current))
    assert "保留当前模型" in t(key, "zh", model=plain(named), current=plain(current))


def test_the_replay_command_reads_no_device_and_no_huge_file(tmp_path):
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "engine", "replay", "--against", "vllm", "/dev/zero"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "error: /dev/zero: not a regular file"
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(100 << 20)  # 100 MiB (sparse)
    result = subprocess.run([sys.executable, "-m", "engine", "replay", "--against", "vllm", str(big)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: {big}: too large (over 67,108,864 bytes)"
    assert time.perf_counter() - start < 60
