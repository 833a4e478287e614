"""Saved workload and run files (engine/runfile.py): round trips, and clear errors on bad or foreign files."""

from __future__ import annotations

import json

import pytest

from engine import runfile
from engine.model_executor.model_loader import DEFAULT_MODEL
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
    assert loaded.settings["enable_prefix_caching"] is None  # the engine's default, unless the file says


def test_scheduler_and_prefix_caching_settings_come_back():
    settings = {"preemption_mode": "swap", "enable_chunked_prefill": True, "max_num_batched_tokens": 48, "enable_prefix_caching": False}
    loaded = load_workload(workload_json(Workload([WorkloadRequest("hi", 2)], settings)).encode(), name="w.json")
    assert {k: loaded.settings[k] for k in settings} == settings
    bad = {"format": "pagedattention-lab/workload", "version": 1, "requests": [{"prompt": "a", "max_tokens": 3}],
           "settings": {"enable_prefix_caching": "yes"}}
    with pytest.raises(RunFileError, match="setting \"enable_prefix_caching\" has a bad value 'yes'"):
        load_workload(json.dumps(bad).encode(), name="w.json")


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
     "request 0: \"max_tokens\" must be an integer from 1 to"),
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


def test_a_run_round_trips_with_every_report_field(tiny_llama_dir, tmp_path):
    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.runfile import Run, load_any, load_run, run_json

    llm = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=6, block_size=4))
    for prompt in ("Hello there, how are you?", "Tell me a story about a dragon."):
        llm.add_request(prompt, SamplingParams(max_tokens=6, ignore_eos=True))
    reports = [llm.step() for _ in range(8)]
    assert any(r.preempted for r in reports) or any(r.finished for r in reports)
    workload = Workload([WorkloadRequest("Hello there, how are you?", 6), WorkloadRequest("Tell me a story about a dragon.", 6)])
    run = Run(workload, dict(model_name="tiny", block_size=4, num_blocks=6, bytes_per_slot=llm.bytes_per_slot),
              {0: "Hello there, how are you?", 1: "Tell me a story about a dragon."}, reports)
    path = tmp_path / "run.json"
    path.write_text(run_json(run), encoding="utf-8")
    loaded = load_run(path)
    assert loaded.steps == reports  # every field of every report, nested dataclasses and int keys included
    assert loaded.prompts == run.prompts and loaded.engine["num_blocks"] == 6
    assert isinstance(load_any(path), Run) and isinstance(load_any(workload_json(workload).encode()), Workload)
    with pytest.raises(RunFileError, match="not a PagedAttention Lab workload file"):
        load_workload(path)  # a run is not a workload file


def test_a_run_tolerates_new_fields_and_names_bad_ones():
    from engine.runfile import load_run

    step = {"step": 0, "phase": "prefill", "scheduled": [], "new_token_ids": {"0": [5]}, "new_text": {"0": "a"},
            "finished": {}, "preempted": [], "events": [{"kind": "allocate", "request_id": 0, "block_id": 1, "logical_index": 0, "shared": True}],
            "block_tables": [{"request_id": 0, "block_table": [1], "filled": [3], "slot_range": None}],
            "memory": {"capacity": 8, "token_states": 3, "reserved": 0, "internal_fragmentation": 1,
                       "external_fragmentation": 0, "free": 4, "bytes_per_slot": 2},
            "sequence_groups": [[0]]}  # a field a later engine may add
    data = {"format": "pagedattention-lab/run", "version": 1, "requests": [{"prompt": "a", "max_tokens": 1}],
            "engine": {"model_name": "m", "block_size": 4, "num_blocks": 2, "bytes_per_slot": 2}, "prompts": {"0": "a"},
            "steps": [step]}
    run = load_run(json.dumps(data).encode(), name="r.json")
    assert run.steps[0].new_token_ids == {0: [5]} and run.steps[0].events[0].block_id == 1
    data["steps"][0]["memory"]["free"] = 5  # no longer sums to the capacity
    with pytest.raises(RunFileError, match="r.json: step 0: memory categories"):
        load_run(json.dumps(data).encode(), name="r.json")
    del data["steps"][0]["memory"]
    with pytest.raises(RunFileError, match="r.json: step 0: "):
        load_run(json.dumps(data).encode(), name="r.json")


def test_a_long_run_is_written_compact_and_reads_back_whole(tiny_llama_dir):
    """A class session must fit an upload: version 2 writes each step lean and as a delta of the one
    before, at least 2.5 times smaller than the whole steps of version 1, and reads back every field;
    a version-1 file of the same run still opens."""
    import dataclasses

    from engine import EngineConfig, LLMEngine, SamplingParams
    from engine.runfile import RUN_VERSION, Run, load_run, run_json

    llm = LLMEngine(EngineConfig(model=str(tiny_llama_dir), num_gpu_blocks=16, block_size=4, max_num_seqs=4))
    prompts = [f"Question {i}: why is the sky blue at noon?" for i in range(8)]
    for prompt in prompts:
        llm.add_request(prompt, SamplingParams(max_tokens=16, ignore_eos=True))
    reports = []
    while llm.has_unfinished_requests():
        reports.append(llm.step())
    assert len(reports) > 30 and any(r.preempted for r in reports) and any(r.cached_free for r in reports)
    run = Run(Workload([WorkloadRequest(p, 16) for p in prompts]),
              dict(model_name="tiny", block_size=4, num_blocks=16, bytes_per_slot=llm.bytes_per_slot), dict(enumerate(prompts)), reports)
    text = run_json(run)
    assert json.loads(text)["version"] == RUN_VERSION == 2
    whole = json.loads(text)
    whole.update(version=1, steps=[dataclasses.asdict(r) for r in reports])
    whole.pop("columns")
    v1 = json.dumps(whole, ensure_ascii=False, separators=(",", ":"))
    assert len(text) * 2.5 < len(v1)  # 2.9x here; 4.1x for a 400-step run of 35 requests on the default model
    assert load_run(text.encode(), name="v2.json").steps == reports
    assert load_run(v1.encode(), name="v1.json").steps == reports


@pytest.mark.parametrize("change, message", [
    (lambda steps: steps[0].update(same=["memory"]), "step 0: the first step cannot refer to a previous one"),
    (lambda steps: steps[1].update(same=["nonsense"]), "step 1: 'nonsense' in \"same\" is not one of memory"),
    (lambda steps: steps[1]["block_tables"][0].__setitem__(2, 99), "step 1: block_tables: request 0: \"keep\" 99 names entries"),
    (lambda steps: steps[1].update(block_tables="x"), "step 1: "),
])
def test_a_bad_delta_is_refused_naming_the_step(change, message):
    from engine.runfile import Run, load_run, run_json
    from engine.report import BlockTableSnapshot, StepReport
    from engine.core.accounting import MemoryUsage

    memory = MemoryUsage(16, 4, 0, 0, 0, 12)
    reports = [StepReport(i, "decode", [], {}, {}, {}, [], [], [BlockTableSnapshot(0, [1, 2], [4, i], seq_id=0)], memory)
               for i in range(2)]
    data = json.loads(run_json(Run(Workload([WorkloadRequest("a", 2)]), dict(model_name="m", block_size=4, num_blocks=4,
                                                                                bytes_per_slot=2), {0: "a"}, reports)))
    assert data["steps"][1]["block_tables"] == [[0, 0, 1, [2], [1]]]  # request 0, seq 0, the first entry kept
    assert load_run(json.dumps(data).encode(), name="r.json").steps == reports
    change(data["steps"])
    with pytest.raises(RunFileError, match=f"r.json: {message}"):
        load_run(json.dumps(data).encode(), name="r.json")


def test_a_small_file_cannot_unfold_into_a_huge_run(monkeypatch):
    """Each step may take its block tables from the step before; a file doing that for ever stops at a bound."""
    from engine import runfile
    from engine.runfile import Run, load_run, run_json
    from engine.report import BlockTableSnapshot, StepReport
    from engine.core.accounting import MemoryUsage

    memory = MemoryUsage(16 * 64, 4, 0, 0, 0, 16 * 64 - 4)
    table = BlockTableSnapshot(0, list(range(64)), [16] * 64, seq_id=0)
    reports = [StepReport(i, "decode", [], {}, {}, {}, [], [], [table], memory) for i in range(40)]
    raw = run_json(Run(Workload([WorkloadRequest("a", 2)]), dict(model_name="m", block_size=16, num_blocks=64, bytes_per_slot=2),
                       {0: "a"}, reports)).encode()
    assert len(load_run(raw, name="r.json").steps) == 40
    monkeypatch.setattr(runfile, "MAX_COPIED_ITEMS", 64 * 3 * 20)
    with pytest.raises(RunFileError, match="r.json: step 2[01]: the steps so far take over 3,840 entries"):
        load_run(raw, name="r.json")
