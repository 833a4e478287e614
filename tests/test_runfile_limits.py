"""Saved files from anywhere (engine/runfile.py): every size a file states is bounded by the file, and
whatever a file holds, reading it either gives a run the page can draw or one RunFileError naming the file."""

from __future__ import annotations

import copy
import json
import os
import resource
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import runfile
from engine.runfile import RunFileError, load_any, load_run, load_workload

REQUESTS = [{"prompt": "a", "max_tokens": 3}, {"prompt": "b", "max_tokens": 2}]


def _step(i: int) -> dict:
    """One step of a paged run in a pool of 4 blocks of 4 slots, as run_json writes it."""
    return {"step": i, "phase": "prefill" if i == 0 else "decode",
            "scheduled": [{"request_id": 0, "phase": "prefill", "num_tokens": 3, "context_len": 3}],
            "new_token_ids": {"0": [5]}, "new_text": {"0": "a"}, "finished": {}, "preempted": [],
            "events": [{"kind": "allocate", "request_id": 0, "block_id": 1, "logical_index": 0},
                       {"kind": "write", "request_id": 0, "block_id": 1, "slot": 5, "position": 1},
                       {"kind": "copy_on_write", "request_id": 1, "block_id": 1, "dst_block_id": 2}],
            "block_tables": [{"request_id": 0, "block_table": [1], "filled": [3], "ref_counts": [2]},
                             {"request_id": 1, "block_table": [1, 2], "filled": [4, 1], "seq_id": 1}],
            "memory": {"capacity": 16, "token_states": 7, "reserved": 0, "internal_fragmentation": 1,
                       "external_fragmentation": 0, "free": 8, "bytes_per_slot": 2},
            "free_queue": [0, 3], "cached_free": {"3": "ab" * 32}}


def _run(**engine) -> dict:
    return {"format": "pagedattention-lab/run", "version": 1, "requests": REQUESTS,
            "engine": {"model_name": "m", "block_size": 4, "num_blocks": 4, "bytes_per_slot": 2, **engine},
            "prompts": {"0": "a", "1": "b"}, "steps": [_step(0), _step(1)]}


def _bytes(data) -> bytes:
    return json.dumps(data).encode()


def _draw(run) -> None:
    """What the Live engine page draws for every step of an opened run (its data, not its widgets)."""
    from app_pages.replay import request_views
    from visualize.memory import memory_frame
    from visualize.pool import event_log_rows, free_queue_cells, pool_map_spec

    for at, report in enumerate(run.steps):
        pool_map_spec(report, run.engine["block_size"], "zh")
        event_log_rows(report, "en")
        free_queue_cells(report, "en")
        request_views(run.prompts, run.steps, at)
    memory_frame(run.steps)


def test_the_hand_made_run_opens_and_draws():
    run = load_run(_bytes(_run()), name="r.json")
    assert run.engine["num_blocks"] == 4 and len(run.steps) == 2
    _draw(run)


def test_a_huge_pool_in_a_small_file_is_refused_at_once_without_building_it():
    data = _run(num_blocks=10**12 // 4)
    for step in data["steps"]:
        step["memory"].update(capacity=10**12, free=10**12 - 8)
    data["padding"] = "x" * 60_000  # a 64 KB upload, as in the report
    raw = _bytes(data)
    assert 60_000 < len(raw) < 65_536
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with pytest.raises(RunFileError, match=r"r.json: \"engine\": num_blocks 250000000000 is not from 1 to"):
        load_run(raw, name="r.json")
    assert time.perf_counter() - start < 1
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KiB: nothing the size of the pool
    # A pool the file agrees with, but whose steps claim another capacity, is refused too.
    data = _run()
    data["steps"][1]["memory"].update(capacity=10**12, free=10**12 - 8)
    with pytest.raises(RunFileError, match=r"r.json: step 1: memory.capacity 1000000000000 is not the pool's 4 blocks"):
        load_run(_bytes(data), name="r.json")


@pytest.mark.parametrize("path, value, message", [
    (("block_tables", 0, "block_table", 0), 9, "block_tables: request 0: block 9 is not in the pool (0 to 3)"),
    (("block_tables", 0, "block_table", 0), -1, "block -1 is not in the pool"),
    (("block_tables", 0, "filled", 0), 99, "filled 99 is not from 0 to 4"),
    (("events", 2, "dst_block_id"), 4, "event copy_on_write: block 4 is not in the pool"),
    (("events", 1, "slot"), 16, "event write: slot 16 is not in the pool"),
    (("free_queue", 0), 10**9, "free_queue / cached_free: block 1000000000 is not in the pool"),
])
def test_block_ids_outside_the_pool_are_refused(path, value, message):
    data = _run()
    target = data["steps"][0]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(RunFileError, match="r.json: step 0: .*" + message.replace("(", r"\(").replace(")", r"\)")):
        load_run(_bytes(data), name="r.json")


@pytest.mark.parametrize("engine, message", [
    ({"block_size": 0}, "block_size 0 is not from 1 to 256"),
    ({"block_size": 10**100}, "block_size 1000000000000000000000000000000000000"),
    ({"num_blocks": 0}, "num_blocks 0 is not from 1 to"),
    ({"bytes_per_slot": 2**50}, "bytes_per_slot 1125899906842624 is over 2**40"),
    ({"model_name": ["x"]}, "model_name must be a string"),
])
def test_bad_engine_shapes_are_refused(engine, message):
    with pytest.raises(RunFileError, match=message.replace("*", r"\*")):
        load_run(_bytes(_run(**engine)), name="r.json")


def test_the_reported_crashers_are_run_file_errors():
    deep = b'{"format": "pagedattention-lab/run", "version": 1, "steps": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    huge_number = b'{"format": "pagedattention-lab/workload", "version": 1, "requests": [{"prompt": "a", "max_tokens": ' \
                  + b"9" * 5000 + b"}]}"
    superscript = _run()
    superscript["prompts"] = {"\u00b2": "a"}  # "²".isdigit() is True, int("²") fails
    superscript_step = _run()
    superscript_step["steps"][0]["new_token_ids"] = {"\u00b3": [5]}
    infinity = b'{"format": "pagedattention-lab/workload", "version": 1, "requests": [{"prompt": "a", "max_tokens": 3}],' \
               b' "settings": {"temperature": Infinity}}'
    for raw, message in [
        (deep, "nested too deeply"), (huge_number, "not a JSON file"), (_bytes(superscript), "\"prompts\" must map request ids"),
        (_bytes(superscript_step), "step 0: "), (infinity, "not a JSON file (Infinity is not a number"),
        (_bytes(_run(block_size=0)), "block_size 0"),
    ]:
        for reader in (load_any, load_run, load_workload):
            with pytest.raises(RunFileError) as error:
                reader(raw, name="x.json")
            assert str(error.value).startswith("x.json: ")
        with pytest.raises(RunFileError) as error:
            load_any(raw, name="x.json")
        assert message in str(error.value)


@pytest.mark.parametrize("setting, value, message", [
    ("allocator", "rm -rf", "setting \"allocator\" has a bad value 'rm -rf' (one of 'paged', 'contiguous' expected)"),
    ("block_size", 10**100, "setting \"block_size\" has a bad value 1000000000"),
    ("block_size", 0, "setting \"block_size\" has a bad value 0 (an integer from 1 to 256 expected)"),
    ("seed", 10**30, "setting \"seed\" has a bad value 1000000000000000000000000000000 (an integer from 0 to"),
    ("seed", 2**63 - 1, "setting \"seed\" has a bad value 9223372036854775807 (an integer from 0 to 9223372036854775806"),
    ("temperature", 1e308 * 10, "not a JSON file"),  # json.dumps writes Infinity
    ("temperature", 1e300, "setting \"temperature\" has a bad value 1e+300 (a number from 0 (greedy) to 100 expected)"),
    ("reservation", "", "setting \"reservation\" has a bad value ''"),
    ("attention_backend", "cuda", "setting \"attention_backend\""),
    ("preemption_mode", "drop", "setting \"preemption_mode\""),
    ("max_num_seqs", 10**9, "setting \"max_num_seqs\" has a bad value 1000000000 (an integer from 1 to 1024 expected)"),
    ("num_gpu_blocks", 10**12, "setting \"num_gpu_blocks\""),
    ("kv_cache_memory", 2**41, "setting \"kv_cache_memory\""),
    ("model", "", "setting \"model\""),
])
def test_workload_settings_out_of_range_are_refused_naming_the_field(setting, value, message):
    data = {"format": "pagedattention-lab/workload", "version": 1, "requests": REQUESTS, "settings": {setting: value}}
    with pytest.raises(RunFileError) as error:
        load_workload(_bytes(data), name="w.json")
    assert str(error.value).startswith("w.json: ") and message in str(error.value)


def test_every_setting_at_its_limit_still_loads():
    limits = {k: v for k, v in runfile.SETTING_LIMITS.items() if k not in ("seed", "kv_cache_memory")}
    data = {"format": "pagedattention-lab/workload", "version": 1, "requests": REQUESTS,
            "settings": {**limits, "seed": 2**63 - 2, "allocator": "contiguous", "reservation": "pow2-total"}}
    loaded = load_workload(_bytes(data), name="w.json")
    assert loaded.settings["block_size"] == 256 and loaded.settings["temperature"] == 100.0


def test_paths_that_are_no_regular_file_or_too_large_are_refused_before_reading(tmp_path, monkeypatch):
    start = time.perf_counter()
    with pytest.raises(RunFileError, match="/dev/zero: not a regular file"):
        load_workload("/dev/zero")
    with pytest.raises(RunFileError, match=r"cannot be read \(Is a directory\)"):
        load_any(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer
    with pytest.raises(RunFileError, match="fifo.json: not a regular file"):
        load_run(fifo)
    monkeypatch.setattr(runfile, "MAX_FILE_BYTES", 1000)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2000)
    with pytest.raises(RunFileError, match=r"big.json: too large \(over 1,000 bytes\)"):
        load_workload(big)
    with pytest.raises(RunFileError, match=r"the file: too large \(2,000 bytes; at most 1,000\)"):
        load_workload(b" " * 2000)
    assert time.perf_counter() - start < 2


# ---- whatever the bytes: a RunFileError or a run that draws -------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


RUN_PATHS = [p for p in _paths(_run()) if p]


def _opens_or_says_why(raw: bytes) -> None:
    try:
        opened = load_any(raw, name="fuzz.json")
    except RunFileError as error:
        assert str(error).startswith("fuzz.json: ")
        return
    if isinstance(opened, runfile.Run):
        _draw(opened)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=300))
def test_random_bytes(raw):
    _opens_or_says_why(raw)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=json_values)
def test_random_json(value):
    _opens_or_says_why(_bytes(value))
    _opens_or_says_why(_bytes({"format": "pagedattention-lab/run", "version": 1, "x": value}))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(st.tuples(st.sampled_from(RUN_PATHS), json_values | st.integers(-(10**20), 10**20)), min_size=1, max_size=3))
def test_a_real_run_with_fields_changed(changes):
    data = copy.deepcopy(_run())
    for path, value in changes:
        target = data
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    _opens_or_says_why(_bytes(data))


def _run_v2() -> dict:
    """The hand-made run as version 2 writes it: lean rows, the second step a delta of the first."""
    return json.loads(runfile.run_json(load_run(_bytes(_run()), name="r.json")))


RUN_V2_PATHS = [p for p in _paths(_run_v2()) if p]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(st.tuples(st.sampled_from(RUN_V2_PATHS), json_values | st.integers(-(10**20), 10**20)), min_size=1, max_size=3))
def test_a_compact_run_with_fields_changed(changes):
    data = _run_v2()
    assert data["version"] == 2 and "same" in data["steps"][1]
    for path, value in changes:
        target = data
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    _opens_or_says_why(_bytes(data))


@pytest.mark.parametrize("key", ["prompts", "clients"])
def test_a_lone_surrogate_in_a_text_is_one_error_naming_its_field(key):
    """JSON's "\\ud800" reads as a lone surrogate, which no page can write back as UTF-8."""
    data = _run()
    data[key] = {"0": "eve \ud800"}
    raw = json.dumps(data).encode()  # ASCII: json.dumps escapes the surrogate, as a hand-made file would
    with pytest.raises(RunFileError, match=f'r.json: "{key}": request 0: the text has a lone surrogate'):
        load_any(raw, name="r.json")
    workload = {"format": "pagedattention-lab/workload", "version": 1, "requests": [{"prompt": "x \udfff", "max_tokens": 2}]}
    with pytest.raises(RunFileError, match='w.json: request 0: "prompt" has a lone surrogate'):
        load_any(_bytes(workload), name="w.json")


@pytest.mark.parametrize("field, value", [("start_ms", 1e308), ("start_ms", -1e308), ("timings_ms", {"total": 1e308}),
                                          ("arrived", {"0": -1e308})])
def test_step_times_are_bounded_so_the_trace_stays_finite(field, value):
    from engine.timeline import chrome_trace_json

    data = _run()
    data["steps"][0][field] = value
    with pytest.raises(RunFileError, match=f"r.json: step 0: .*ms is not from -1e\\+12 to 1e\\+12"):
        load_run(_bytes(data), name="r.json")
    data["steps"][0][field] = {"total": 1e12} if field == "timings_ms" else ({"0": -1e12} if field == "arrived" else 1e12)
    trace = chrome_trace_json(load_run(_bytes(data), name="r.json").steps)  # at the bound: strict JSON, finite
    json.loads(trace, parse_constant=lambda word: pytest.fail(f"the trace holds {word}"))
