"""Saved workload and run files (engine/runfile.py): round trips, and clear errors on bad or foreign files."""

from __future__ import annotations

import json

import pytest

from engine import runfile
from engine.model_loader import DEFAULT_MODEL
from engine.runfile import RunFileError, Workload, WorkloadRequest, load_workload, workload_json


def test_default_model_name_matches_the_loader():
    assert runfile.DEFAULT_MODEL == DEFAULT_MODEL


def test_workload_round_trip(tmp_path):
    workload = Workload([WorkloadRequest("What is 2 + 2?", 16), WorkloadRequest("讲个故事", 40)],
                        {"block_size": 8, "num_gpu_blocks": 32, "temperature": 0.7, "seed": 3})
    path = tmp_path / "w.json"
    path.write_text(workload_json(workload), encoding="utf-8")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert (data["format"], data["version"]) == ("pagedattention-lab/workload", 1)
    loaded = load_workload(path)
    assert loaded.requests == workload.requests
    assert loaded.settings["block_size"] == 8 and loaded.settings["num_gpu_blocks"] == 32
    assert loaded.settings["allocator"] == "paged"  # missing keys take their defaults
    assert load_workload(path.read_bytes(), name="w.json").requests == workload.requests


def test_unknown_keys_are_ignored():
    data = {"format": "pagedattention-lab/workload", "version": 1, "future": [1, 2],
            "settings": {"block_size": 4, "prefix_caching": True},
            "requests": [{"prompt": "hi", "max_tokens": 2, "n": 3}]}
    loaded = load_workload(json.dumps(data).encode(), name="new.json")
    assert loaded.requests == [WorkloadRequest("hi", 2)] and loaded.settings["block_size"] == 4
    assert "prefix_caching" not in loaded.settings


@pytest.mark.parametrize("content, message", [
    (b"{not json", "x.json: not a JSON file"),
    (b"[1, 2]", "x.json: not a PagedAttention Lab file"),
    (b'{"cells": []}', "not a PagedAttention Lab workload file (no \"format\" key"),
    (b'{"format": "pagedattention-lab/run", "version": 1}', "format 'pagedattention-lab/run'"),
    (b'{"format": "pagedattention-lab/workload", "version": 99, "requests": []}', "version 99 was written by a newer"),
    (b'{"format": "pagedattention-lab/workload", "version": "1"}', "bad \"version\""),
    (b'{"format": "pagedattention-lab/workload", "version": 1, "requests": []}', "\"requests\" must be a non-empty list"),
    (b'{"format": "pagedattention-lab/workload", "version": 1, "requests": [{"prompt": "a", "max_tokens": 0}]}',
     "request 0: \"max_tokens\" must be an integer >= 1"),
    (b'{"format": "pagedattention-lab/workload", "version": 1, "requests": [{"prompt": " ", "max_tokens": 3}]}',
     "request 0: \"prompt\" must be a non-empty string"),
    (b'{"format": "pagedattention-lab/workload", "version": 1, "requests": [{"prompt": "a", "max_tokens": 3}],'
     b' "settings": {"block_size": 0}}', "setting \"block_size\" has a bad value 0"),
    (b'{"format": "pagedattention-lab/workload", "version": 1, "requests": [{"prompt": "a", "max_tokens": 3}],'
     b' "settings": {"num_gpu_blocks": 8, "kv_cache_memory": 100}}', "not both"),
])
def test_bad_files_are_refused_with_a_reason(content, message):
    with pytest.raises(RunFileError) as error:
        load_workload(content, name="x.json")
    assert message in str(error.value)
    assert str(error.value).startswith("x.json: ")


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(RunFileError, match="nope.json: cannot be read"):
        load_workload(tmp_path / "nope.json")
