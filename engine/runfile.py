"""Saved workloads and saved runs as small, versioned JSON files.

A teacher saves a workload with its engine settings, loads it again in class, or hands it to another
tool (e.g. a replay on real vLLM). The file is plain JSON, UTF-8::

    {
      "format": "pagedattention-lab/workload",
      "version": 1,
      "settings": {"model": "SmolLM2-135M-Instruct", "block_size": 16,
                   "num_gpu_blocks": 64, "kv_cache_memory": null, "allocator": "paged",
                   "reservation": "max", "attention_backend": "torch", "max_num_seqs": 8,
                   "temperature": 0.0, "seed": 0},
      "requests": [{"prompt": "What is 2 + 2?", "max_tokens": 16}, ...]
    }

- ``format`` and ``version`` come first and are checked first: a file of another format, or of a
  newer version than this code reads, is refused with an error that says so.
- ``settings``: every key is optional (missing = the default in :data:`SETTINGS_DEFAULTS`), and the
  names are :class:`~engine.EngineConfig`'s plus ``temperature`` (sampling; 0 = greedy) and ``seed``.
  ``num_gpu_blocks`` (blocks) and ``kv_cache_memory`` (bytes) size the KV pool; at most one is set.
  ``model`` is a local path, a hub id, or "SmolLM2-135M-Instruct" for the default model (on the hub:
  HuggingFaceTB/SmolLM2-135M-Instruct).
- ``requests``: one per request, in order (request id = position). ``prompt`` is the user's message,
  sent through the model's chat template; ``max_tokens`` the most tokens to generate (>= 1).
  Request *i* samples with seed ``settings.seed + i``.
- Keys this version does not know are ignored on load (a newer writer may add some), so a reader
  never fails on a field added later; a wrong type or value of a known key is an error naming it.

A **run file** (format ``"pagedattention-lab/run"``, version 2; version 1 is read too) is a whole run,
to replay it later without the model: the same ``settings`` and ``requests`` as a workload file, plus

- ``engine``: ``model_name``, ``block_size`` (slots per block), ``num_blocks``, ``bytes_per_slot``
  (bytes of one token's K and V over all layers);
- ``prompts``: per request id (a JSON string key), the prompt text as the app shows it;
- ``steps``: every kept :class:`~engine.report.StepReport`, in order, each written field by field
  (``dataclasses.asdict``: nested Event, BlockTableSnapshot, ScheduledRequest and MemoryUsage become
  objects, dict keys become strings). Fields added to StepReport later are written the same way;
  on load, fields the reader's StepReport does not have are ignored, and missing ones take their
  defaults (a missing field without a default is an error).

Version 2 writes the same steps about four times smaller (a 400-step run of 35 requests: 2.6 MB in
version 1, 0.6 MB), so that a class session fits an upload:

- a field equal to its default is left out (an event's empty fields, a decode's 0 prefill tokens);
- ``columns`` (top level) names, for each list of records in a step (``scheduled``, ``events``,
  ``block_tables``, ``cpu_block_tables``), the order of their fields; each record is then a row of
  values in that order, the trailing defaults left out;
- each step after the first is a delta of the one before: ``same`` lists the fields equal to the
  previous step's (``memory``, ``free_queue``, ...); a block table's ``keep`` says how many of its first
  entries (block, filled, refcount) equal the previous step's table of the same sequence, and only
  the rest follows; ``cached_free`` is written as ``cached_free_added`` and ``cached_free_removed``.

Version 1 files hold every step whole, as ``dataclasses.asdict`` writes it.

Every size a file states is checked against what the file itself holds before anything is built from
it: a run's pool (``engine.num_blocks``) has at most :data:`MAX_RUN_BLOCKS` blocks and no more blocks than
the file has bytes, each step's ``memory.capacity`` is that pool, and every block id a step names lies
in it. A file is read up to :data:`MAX_FILE_BYTES`; JSON nested deeper than :data:`MAX_JSON_DEPTH`, a
number with more digits than Python parses, ``NaN`` or ``Infinity`` are refused. Every time a step states
(``start_ms``, ``timings_ms``, ``arrived``) lies within :data:`MAX_TIME_MS`, so that the timeline and
its trace stay finite, and every text (prompts, ``clients``) can be written back as UTF-8.

Every error is a :class:`RunFileError` (a ``ValueError``) that starts with the file's name, whatever
the file holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from engine.config import DEFAULT_MODEL

WORKLOAD_FORMAT = "pagedattention-lab/workload"
RUN_FORMAT = "pagedattention-lab/run"
VERSION = 1  # a workload file's (the classroom server's stream of full steps says this one too)
RUN_VERSION = 2  # a run file's: version 2 writes each step lean and as a delta of the one before

SETTINGS_DEFAULTS: dict = {
    "model": DEFAULT_MODEL,
    "block_size": 16,
    "num_gpu_blocks": 64,
    "kv_cache_memory": None,
    "allocator": "paged",
    "reservation": "max",
    "attention_backend": "torch",
    "max_num_seqs": 8,
    "temperature": 0.0,
    "seed": 0,
    "preemption_mode": "recompute",
    "enable_chunked_prefill": False,
    "max_num_batched_tokens": None,
    "enable_prefix_caching": None,  # None: the engine's default (on with the paged allocator)
    "num_speculative_tokens": 0,  # speculative decoding by prompt lookup ("ngram"), k drafts per step; 0: off
    "kv_cache_dtype": "auto",  # vLLM's kv_cache_dtype: the KV pool's element type
}
_OPTIONAL_INTS = ("num_gpu_blocks", "kv_cache_memory", "max_num_batched_tokens")
# The values each string setting may take: engine.config's choices (not imported: no torch here).
SETTING_CHOICES = {
    "allocator": ("paged", "contiguous"),
    "reservation": ("max", "pow2", "pow2-total", "oracle"),
    "attention_backend": ("auto", "torch", "triton"),
    "preemption_mode": ("recompute", "swap"),
    "kv_cache_dtype": ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
}
# Upper bounds of the numeric settings (inclusive). A file outside them is refused, naming the field,
# rather than clamped: 10**100 blocks or seed 10**30 is a broken file, not a setting to round.
SETTING_LIMITS = {
    "block_size": 256,  # slots per block; vLLM's CUDA kernels take up to 256 (the lab's app offers 1-32)
    "num_gpu_blocks": 1 << 20,
    "kv_cache_memory": 1 << 40,  # bytes (1 TiB)
    "max_num_seqs": 1024,
    "max_num_batched_tokens": 1 << 20,
    "seed": (1 << 63) - 1,  # torch.manual_seed's range; request i samples with seed + i (checked too)
    "temperature": 100.0,
    "num_speculative_tokens": 64,
}
MAX_TOKENS_LIMIT = 1 << 20  # a request's max_tokens
MAX_FILE_BYTES = 64 << 20  # a file is read up to this size (the app's uploads stop at 1 MB)
MAX_JSON_DEPTH = 64  # the files nest 5 levels; deeper JSON is refused before it is parsed
MAX_RUN_BLOCKS = 1 << 16  # blocks in a run's pool (the app's pools have at most 512)
# Entries a version-2 run's steps take from the steps before them, in all: a class session of 5,000
# steps takes about a million; a small file naming a long table again in every step stops here.
MAX_COPIED_ITEMS = 1 << 22
MAX_BLOCK_SIZE = SETTING_LIMITS["block_size"]
MAX_TIME_MS = 1e12  # a step's times, ms (about 30 years): a trace multiplies them by 1,000 and must stay finite


class RunFileError(ValueError):
    """A file that is not a readable workload/run file of a version this code knows."""


@dataclass(frozen=True)
class WorkloadRequest:
    """One request: the user's ``prompt`` (chat message text) and ``max_tokens`` (>= 1)."""

    prompt: str
    max_tokens: int


@dataclass
class Workload:
    """Requests in order plus the engine and sampling settings (keys of :data:`SETTINGS_DEFAULTS`)."""

    requests: list[WorkloadRequest]
    settings: dict = field(default_factory=lambda: dict(SETTINGS_DEFAULTS))


def workload_json(workload: Workload) -> str:
    """The workload as the JSON text of a version-1 workload file (module docstring)."""
    return json.dumps(_workload_dict(workload, WORKLOAD_FORMAT), ensure_ascii=False, indent=1)


def load_workload(source: str | Path | bytes, name: str | None = None) -> Workload:
    """Read a workload file: a path, or the file's bytes (an upload) with ``name`` for errors.

    Raises:
        RunFileError: not JSON, another format, a newer version, or a bad setting or request (named);
            whatever is wrong with the file, never another exception.
    """
    with _as_run_file_error(source, name):
        data, name = _read(source, name)
        _check_header(data, WORKLOAD_FORMAT, name)
        return _workload(data, name)


@dataclass
class Run:
    """A saved run: its workload, the engine's shape, the prompts as shown, and the step reports."""

    workload: Workload
    engine: dict  # model_name, block_size, num_blocks, bytes_per_slot
    prompts: dict[int, str]
    steps: list  # list[engine.report.StepReport]


ENGINE_KEYS = ("model_name", "block_size", "num_blocks", "bytes_per_slot")


def run_json(run: Run) -> str:
    """The run as the JSON text of a version-2 run file: each step lean and as a delta of the one
    before (module docstring)."""
    data = _workload_dict(run.workload, RUN_FORMAT)
    data["version"] = RUN_VERSION
    data["engine"] = {k: run.engine[k] for k in ENGINE_KEYS}
    data["prompts"] = {str(k): v for k, v in run.prompts.items()}
    columns = _columns()
    data["columns"] = {k: [c for c, _ in cols] for k, cols in columns.items()}
    data["steps"], previous = [], None
    for report in run.steps:
        step = _lean(report)
        data["steps"].append(_as_rows(_step_delta(step, previous), columns))
        previous = step
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


# ---- version 2: lean steps, each a delta of the one before ---------------------------------------

SAME = "same"  # a version-2 step's list of fields equal to the previous step's
KEEP = "keep"  # a version-2 block table's first entries, equal to the previous step's table of that sequence
_SAME_FIELDS = ("memory", "cpu_memory", "prefix_cache", "free_queue", "swapped", "cpu_block_tables", "sharing")
_TABLE_LISTS = ("block_table", "filled", "ref_counts")


# The step fields that are lists of records: each record written as a row of values, in an order of
# columns the file states once (``columns``); the fields named here first, any others after them.
_ROW_ORDER = {
    "scheduled": ("request_id", "phase", "num_tokens", "context_len", "num_computed_tokens", "num_prefill_tokens"),
    "events": ("kind", "request_id", "block_id", "slot", "position", "logical_index", "seq_id", "detail"),
    "block_tables": ("request_id", "seq_id", KEEP, "block_table", "filled", "ref_counts", "index"),
    "cpu_block_tables": ("request_id", "seq_id", KEEP, "block_table", "filled", "ref_counts", "index"),
}


def _columns() -> dict[str, list[tuple[str, object]]]:
    """Per row field of a step, its columns as (name, JSON default); :data:`KEEP` defaults to None (absent)."""
    from engine.report import StepReport

    hints = typing.get_type_hints(StepReport)
    out = {}
    for name, first in _ROW_ORDER.items():
        record = typing.get_args(hints[name])[0]
        defaults = {KEEP: None}
        for f in dataclasses.fields(record):
            defaults[f.name] = _lean(f.default if f.default is not dataclasses.MISSING else
                                     f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        out[name] = [(c, defaults[c]) for c in first] + [(c, d) for c, d in defaults.items() if c not in first]
    return out


def _as_rows(step: dict, columns: dict) -> dict:
    """A step's record lists as rows of values in ``columns``' order, trailing defaults left out."""
    out = dict(step)
    for name, cols in columns.items():
        if name in step:
            out[name] = [_row(record, cols) for record in step[name]]
    return out


def _row(record: dict, cols: list[tuple[str, object]]) -> list:
    row = [record.get(c, default) for c, default in cols]
    while row and row[-1] == cols[len(row) - 1][1]:
        row.pop()
    return row


def _from_rows(step, columns: dict[str, list[str]]):
    """A version-2 step's rows back as records (a name with the value None is left out)."""
    if not isinstance(step, dict):
        return step
    out = dict(step)
    for name, cols in columns.items():
        if name in step:
            out[name] = [dict((c, v) for c, v in zip(cols, _expect(row, list)) if v is not None) for row in _expect(step[name], list)]
    return out


def _lean(value):
    """``dataclasses.asdict`` without the fields that equal their defaults (the reader's
    :func:`from_json` puts them back)."""
    if dataclasses.is_dataclass(value):
        out = {}
        for f in dataclasses.fields(value):
            v = getattr(value, f.name)
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            if default is dataclasses.MISSING or v != default:
                out[f.name] = _lean(v)
        return out
    if isinstance(value, (list, tuple)):
        return [_lean(v) for v in value]
    if isinstance(value, dict):
        return {k: _lean(v) for k, v in value.items()}
    return value


def _step_delta(step: dict, previous: dict | None) -> dict:
    """``step`` (a lean StepReport) as written: fields equal to ``previous``'s listed under
    :data:`SAME`, each block table as its change from the same sequence's table in ``previous``,
    ``cached_free`` as the blocks that became cached (``cached_free_added``) and stopped being
    (``cached_free_removed``). :func:`_step_from_delta` undoes it."""
    if previous is None:
        return step
    out = dict(step)
    same = [k for k in _SAME_FIELDS if step.get(k) == previous.get(k) and k in previous]
    for k in same:
        del out[k]
    if same:
        out[SAME] = same
    before = {(t["request_id"], t.get("seq_id")): t for t in previous.get("block_tables", [])}
    out["block_tables"] = [_table_delta(t, before.get((t["request_id"], t.get("seq_id")))) for t in step["block_tables"]]
    old, new = previous.get("cached_free", {}), step.get("cached_free", {})
    out.pop("cached_free", None)
    added = {b: h for b, h in new.items() if old.get(b) != h}
    removed = [int(b) for b in old if b not in new]
    if added:
        out["cached_free_added"] = added
    if removed:
        out["cached_free_removed"] = removed
    return out


def _table_delta(table: dict, before: dict | None) -> dict:
    """A block table as its first :data:`KEEP` entries' count (equal to ``before``'s) and the rest."""
    if before is None:
        return table
    if bool(table.get("ref_counts")) != bool(before.get("ref_counts")):
        return table
    lists = [(table.get(k, []), before.get(k, [])) for k in _TABLE_LISTS if table.get(k) or before.get(k)]
    keep = 0
    while all(keep < len(a) and keep < len(b) and a[keep] == b[keep] for a, b in lists):
        keep += 1
    if not keep:
        return table
    out = {k: v for k, v in table.items() if k not in _TABLE_LISTS}
    out[KEEP] = keep
    for k in _TABLE_LISTS:
        if table.get(k):
            out[k] = table[k][keep:]
    return out


def _step_from_delta(step, previous: dict | None, copied: list[int]) -> dict:
    """A version-2 step in full lean form, from what the file holds and the previous step's full form.
    ``copied``: a one-item counter of the list and object entries taken from previous steps so far.

    Raises:
        ValueError: a delta that names something the previous step does not have, or a run whose
            steps would take more than :data:`MAX_COPIED_ITEMS` entries from the steps before them
            (a small file must not unfold into a huge run).
    """
    if not isinstance(step, dict):
        raise ValueError(f"an object expected, got {type(step).__name__}")
    if previous is None:
        if any(k in step for k in (SAME, "cached_free_added", "cached_free_removed")) or any(
                isinstance(t, dict) and KEEP in t for t in _expect(step.get("block_tables", []), list)):
            raise ValueError("the first step cannot refer to a previous one")
        return step
    out = {k: v for k, v in step.items() if k not in (SAME, "cached_free_added", "cached_free_removed")}
    for k in _expect(step.get(SAME, []), list):
        if k not in _SAME_FIELDS:
            raise ValueError(f"{short_repr(k)} in \"{SAME}\" is not one of {', '.join(_SAME_FIELDS)}")
        if k in previous:
            out[k] = previous[k]
            copied[0] += len(previous[k]) if isinstance(previous[k], (list, dict)) else 1
    before = {(t.get("request_id"), t.get("seq_id")): t for t in previous.get("block_tables", [])}
    tables = []
    for table in _expect(step.get("block_tables", []), list):
        if isinstance(table, dict) and KEEP in table:
            old = before.get((table.get("request_id"), table.get("seq_id")))
            keep = table[KEEP]
            if old is None or not _is_int(keep) or keep > len(old.get("block_table", [])):
                raise ValueError(f"block_tables: request {short_repr(table.get('request_id'))}: "
                                 f"\"{KEEP}\" {short_repr(keep)} names entries the previous step does not have")
            copied[0] += keep * len(_TABLE_LISTS)
            table = {**{k: v for k, v in table.items() if k != KEEP},
                     **{k: old.get(k, [])[:keep] + _expect(table.get(k, []), list) for k in _TABLE_LISTS if old.get(k) or table.get(k)}}
        tables.append(table)
    out["block_tables"] = tables
    cached = {k: v for k, v in previous.get("cached_free", {}).items()}
    copied[0] += len(cached)
    if copied[0] > MAX_COPIED_ITEMS:
        raise ValueError(f"the steps so far take over {MAX_COPIED_ITEMS:,} entries from the steps before them "
                         "(more than a run this lab saves)")
    for b in _expect(step.get("cached_free_removed", []), list):
        cached.pop(str(b), None)
    cached.update(_expect(step.get("cached_free_added", {}), dict))
    if cached:
        out["cached_free"] = cached
    return out


def load_run(source: str | Path | bytes, name: str | None = None) -> Run:
    """Read a run file (a path, or bytes with ``name``); the step reports come back as StepReports.

    Sizes are bounded by the file (module docstring): the pool has at most :data:`MAX_RUN_BLOCKS` blocks
    and no more than the file has bytes, every step's capacity is that pool, and every block id a
    step names lies in it, so that the page can draw every step it opens.

    Raises:
        RunFileError: not JSON, another format, a newer version, or a bad field (named); whatever is
            wrong with the file, never another exception.
    """
    with _as_run_file_error(source, name):
        data, name = _read(source, name)
        return _run(data, name, _size_of(source))


def load_any(source: str | Path | bytes, name: str | None = None) -> Workload | Run:
    """A workload file or a run file, whichever ``source`` is (by its ``format``).

    Raises:
        RunFileError: as :func:`load_workload` and :func:`load_run`.
    """
    with _as_run_file_error(source, name):
        data, name = _read(source, name)
        if data.get("format") == RUN_FORMAT:
            return _run(data, name, _size_of(source))
        _check_header(data, WORKLOAD_FORMAT, name)
        return _workload(data, name)


def _size_of(source) -> int:
    return len(source) if isinstance(source, (bytes, bytearray)) else Path(source).stat().st_size


def _run(data: dict, name: str, size: int) -> Run:
    from engine.report import StepReport  # here, so that workload files need nothing but the standard library

    _check_header(data, RUN_FORMAT, name)
    workload = _workload(data, name)
    engine = data.get("engine")
    if not isinstance(engine, dict) or any(not _is_int(engine.get(k)) for k in ENGINE_KEYS[1:]):
        raise RunFileError(f"{name}: \"engine\" must hold integers {', '.join(ENGINE_KEYS[1:])}")
    if not isinstance(engine.get("model_name", ""), str):
        raise RunFileError(f"{name}: \"engine\": model_name must be a string")
    block_size, num_blocks = engine["block_size"], engine["num_blocks"]
    if not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise RunFileError(f"{name}: \"engine\": block_size {short_repr(block_size)} is not from 1 to {MAX_BLOCK_SIZE}")
    most = min(MAX_RUN_BLOCKS, size)
    if not 1 <= num_blocks <= most:
        raise RunFileError(f"{name}: \"engine\": num_blocks {short_repr(num_blocks)} is not from 1 to {most} "
                           f"(at most {MAX_RUN_BLOCKS}, and no more blocks than the file has bytes)")
    if engine["bytes_per_slot"] > 1 << 40:
        raise RunFileError(f"{name}: \"engine\": bytes_per_slot {short_repr(engine['bytes_per_slot'])} is over 2**40")
    prompts = _texts_by_id(data.get("prompts"), "prompts", name)
    _texts_by_id(data.get("clients", {}), "clients", name)  # a classroom session's labels (engine/entrypoints/lab.py)
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise RunFileError(f"{name}: \"steps\" must be a non-empty list of step reports")
    columns = data.get("columns", {}) if data["version"] >= 2 else {}
    if not isinstance(columns, dict) or not all(k in _ROW_ORDER and isinstance(v, list) and all(isinstance(c, str) for c in v)
                                                for k, v in columns.items()):
        raise RunFileError(f"{name}: \"columns\" must map {', '.join(_ROW_ORDER)} to lists of field names")
    reports, previous, copied = [], None, [0]
    for i, step in enumerate(steps):
        try:
            if data["version"] >= 2:
                step = previous = _step_from_delta(_from_rows(step, columns), previous, copied)
            report = from_json(StepReport, step)
            _check_step(report, block_size, num_blocks)
        except (TypeError, ValueError, KeyError) as error:
            raise RunFileError(f"{name}: step {i}: {error}") from None
        reports.append(report)
    engine = {k: engine.get(k) for k in ENGINE_KEYS}
    return Run(workload, engine, {int(k): v for k, v in prompts.items()}, reports)


def _check_step(report, block_size: int, num_blocks: int) -> None:
    """Every size and block id of a step lies in the run's pool (``num_blocks`` of ``block_size`` slots).

    Raises:
        ValueError: the first one that does not, named.
    """
    from engine.report import SWAP_IN, SWAP_OUT

    if report.phase not in STEP_PHASES:
        raise ValueError(f"phase {short_repr(report.phase)} is not one of {', '.join(STEP_PHASES)}")
    for scheduled in report.scheduled:
        if scheduled.phase not in ("prefill", "decode"):
            raise ValueError(f"scheduled: request {scheduled.request_id}: phase {short_repr(scheduled.phase)} is not prefill or decode")
    for rid, reason in report.finished.items():
        if reason not in FINISH_REASONS:
            raise ValueError(f"finished: request {rid}: {short_repr(reason)} is not one of {', '.join(FINISH_REASONS)}")
    for key in report.timings_ms:
        if not (key.isascii() and key.replace("_", "").isalnum() and len(key) <= 32):
            raise ValueError(f"timings_ms: {short_repr(key)} is not a phase name (letters, digits and _)")
    times = [("start_ms", report.start_ms), *((f"timings_ms.{k}", v) for k, v in report.timings_ms.items()),
             *((f"arrived: request {k}", v) for k, v in report.arrived.items())]
    for where, ms in times:
        if ms is not None and not -MAX_TIME_MS <= ms <= MAX_TIME_MS:
            raise ValueError(f"{where}: {short_repr(ms)} ms is not from -{MAX_TIME_MS:g} to {MAX_TIME_MS:g}")
    capacity = num_blocks * block_size
    if report.memory.capacity not in (capacity, capacity - block_size):  # a pool that keeps a null block counts one less
        raise ValueError(f"memory.capacity {short_repr(report.memory.capacity)} is not the pool's {num_blocks} blocks "
                         f"x {block_size} slots = {capacity}")
    cpu_blocks = 0
    if report.cpu_memory is not None:
        cpu_capacity = report.cpu_memory.capacity
        if cpu_capacity % block_size or cpu_capacity // block_size > MAX_RUN_BLOCKS:
            raise ValueError(f"cpu_memory.capacity {short_repr(cpu_capacity)} is not a whole number of at most "
                             f"{MAX_RUN_BLOCKS} blocks of {block_size} slots")
        cpu_blocks = cpu_capacity // block_size

    def check(block, where: str, pool: int = num_blocks) -> None:
        if block is not None and not 0 <= block < pool:
            raise ValueError(f"{where}: block {short_repr(block)} is not in the pool (0 to {pool - 1})")

    for table in report.block_tables:
        if len(table.filled) != len(table.block_table) or (table.ref_counts and len(table.ref_counts) != len(table.block_table)):
            raise ValueError(f"block_tables: request {table.request_id}: block_table, filled and ref_counts differ in length")
        for block, filled in zip(table.block_table, table.filled):
            check(block, f"block_tables: request {table.request_id}")
            if not 0 <= filled <= block_size:
                raise ValueError(f"block_tables: request {table.request_id}: filled {short_repr(filled)} is not from 0 to {block_size}")
        if table.slot_range is not None and not 0 <= table.slot_range[0] <= table.slot_range[1] <= capacity:
            raise ValueError(f"block_tables: request {table.request_id}: slot_range {table.slot_range} is not in the pool")
    for group in report.kv_groups:
        for table in group.block_tables:
            for block in table.block_table:
                check(block, f"kv_groups: group {group.group_id}: request {table.request_id}")
    for table in report.cpu_block_tables:
        for block in table.block_table:
            check(block, f"cpu_block_tables: request {table.request_id}", cpu_blocks)
    for event in report.events:
        needed = EVENT_FIELDS.get(event.kind)
        if needed is None:
            raise ValueError(f"event kind {short_repr(event.kind)} is not one of {', '.join(EVENT_FIELDS)}")
        missing = [f for f in needed if getattr(event, f) is None]
        if missing:
            raise ValueError(f"event {event.kind}: {', '.join(missing)} missing")
        gpu_source = event.kind != SWAP_IN
        check(event.block_id, f"event {event.kind}", num_blocks if gpu_source else cpu_blocks)
        if event.dst_block_id is not None:
            check(event.dst_block_id, f"event {event.kind}", cpu_blocks if event.kind == SWAP_OUT else num_blocks)
        if event.slot is not None and not 0 <= event.slot < capacity:
            raise ValueError(f"event {event.kind}: slot {short_repr(event.slot)} is not in the pool")
    for block in [*report.free_queue, *report.cached_free]:
        check(block, "free_queue / cached_free")
    for gpu, cpu in report.blocks_to_swap_out:
        check(gpu, "blocks_to_swap_out"), check(cpu, "blocks_to_swap_out", cpu_blocks)
    for cpu, gpu in report.blocks_to_swap_in:
        check(cpu, "blocks_to_swap_in", cpu_blocks), check(gpu, "blocks_to_swap_in")


STEP_PHASES = ("prefill", "decode", "mixed", "idle")
FINISH_REASONS = ("stop", "length", "abort", "error")  # a request's (engine.report.StepReport.finished)
# The fields the engine always sets, per event kind (engine/report.py's Event).
EVENT_FIELDS = {
    "allocate": ("block_id", "logical_index"), "write": ("block_id", "slot", "position"), "free": ("block_id",),
    "preempt": (), "finish": (), "fork": ("seq_id", "parent_seq_id"), "copy_on_write": ("block_id", "dst_block_id"),
    "cache_hit": ("block_id", "logical_index"), "evict": ("block_id",), "swap_out": ("block_id", "dst_block_id"),
    "swap_in": ("block_id", "dst_block_id"), "spec_propose": ("block_id", "slot", "position"),
    "spec_accept": ("block_id", "slot", "position"), "spec_reject": ("block_id", "slot", "position"),
}


def _texts_by_id(texts, key: str, name: str) -> dict:
    """``texts`` checked as request id -> text, every text writable as UTF-8.

    Raises:
        RunFileError: naming ``key`` (and the request whose text has a lone surrogate).
    """
    if not isinstance(texts, dict) or not all(_is_id(k) and isinstance(v, str) for k, v in texts.items()):
        raise RunFileError(f"{name}: \"{key}\" must map request ids (0, 1, ...) to texts")
    bad = next((k for k, v in texts.items() if not _is_utf8(v)), None)
    if bad is not None:
        raise RunFileError(f"{name}: \"{key}\": request {bad}: the text has a lone surrogate (it cannot be UTF-8)")
    return texts


def _is_utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (JSON's ``\\ud800`` reads as a lone surrogate, which cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_id(key: str) -> bool:
    """A request id as a JSON object key: ASCII digits only ("²" and "٣" are digits to str.isdigit, not to int)."""
    return isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 18


@contextlib.contextmanager
def _as_run_file_error(source, name: str | None):
    """Whatever goes wrong while reading a file becomes a RunFileError naming the file (the loaders' promise)."""
    try:
        yield
    except RunFileError:
        raise
    except (Exception, RecursionError) as error:  # noqa: BLE001 - a file must never crash its reader
        what = name or (str(source) if isinstance(source, (str, Path)) else "the file")
        raise RunFileError(f"{what}: cannot be opened ({type(error).__name__}: {short_repr(str(error), 200)})") from None


def from_json(cls, value):
    """An instance of ``cls`` (a dataclass, or a type hint such as ``list[Event]``, ``dict[int, str]``,
    ``int | None``, ``tuple[int, int]``) from its ``dataclasses.asdict`` JSON form.

    Dataclass fields missing from ``value`` take their defaults; keys that are not fields are ignored.

    Raises:
        ValueError / TypeError: a value of the wrong kind, or a missing field without a default.
    """
    if dataclasses.is_dataclass(cls):
        if not isinstance(value, dict):
            raise ValueError(f"{cls.__name__}: an object expected, got {type(value).__name__}")
        hints = typing.get_type_hints(cls)
        kwargs = {f.name: from_json(hints[f.name], value[f.name]) for f in dataclasses.fields(cls) if f.init and f.name in value}
        return cls(**kwargs)
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return from_json(next(a for a in args if a is not type(None)), value)
    if origin is list:
        return [from_json(args[0], v) for v in _expect(value, list)]
    if origin is tuple:
        return tuple(from_json(a, v) for a, v in zip(args, _expect(value, list)))
    if origin is dict:
        return {from_json(args[0], k): from_json(args[1], v) for k, v in _expect(value, dict).items()}
    if cls is int:
        return int(value) if isinstance(value, str) and _is_id(value.removeprefix("-")) else _expect(value, int)
    if cls is float:
        return float(_expect(value, (int, float)))
    if cls in (str, bool):
        return _expect(value, cls)
    return value


def _expect(value, kind):
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{value!r} is not a {getattr(kind, '__name__', kind)}")
    return value


def _is_int(value) -> bool:
    """A JSON integer >= 0 (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# ---- shared by workload and run files -----------------------------------------------------------


def _workload_dict(workload: Workload, fmt: str) -> dict:
    return {
        "format": fmt,
        "version": VERSION,
        "settings": {**SETTINGS_DEFAULTS, **workload.settings},
        "requests": [{"prompt": r.prompt, "max_tokens": r.max_tokens} for r in workload.requests],
    }


def _read(source: str | Path | bytes, name: str | None) -> tuple[dict, str]:
    if isinstance(source, (bytes, bytearray)):
        raw, name = bytes(source), name or "the file"
    else:
        name = name or str(source)
        raw = read_capped(source, name)
    if len(raw) > MAX_FILE_BYTES:
        raise RunFileError(f"{name}: too large ({len(raw):,} bytes; at most {MAX_FILE_BYTES:,})")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise RunFileError(f"{name}: not a JSON file this reader opens (nested too deeply)") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, a number of more than 4,300 digits
        raise RunFileError(f"{name}: not a JSON file ({error})") from None
    if not isinstance(data, dict):
        raise RunFileError(f"{name}: not a PagedAttention Lab file (a JSON object with \"format\" and \"version\" expected)")
    if _depth(data) > MAX_JSON_DEPTH:
        raise RunFileError(f"{name}: nested deeper than {MAX_JSON_DEPTH} levels, so not a PagedAttention Lab file")
    return data, name


def read_capped(path: str | Path, name: str | None = None, limit: int | None = None) -> bytes:
    """A regular file's bytes, at most ``limit`` of them (a device such as /dev/zero, a FIFO or a
    directory is refused before it is read); ``limit`` defaults to :data:`MAX_FILE_BYTES`.

    Raises:
        RunFileError: the file cannot be read, is not a regular file, or is larger than ``limit`` bytes.
    """
    import stat

    name, limit = name or str(path), MAX_FILE_BYTES if limit is None else limit
    try:
        # O_NONBLOCK: opening a FIFO does not wait for a writer (it is then refused, as not a regular file).
        with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise RunFileError(f"{name}: not a regular file")
            raw = file.read(limit + 1)
    except OSError as error:
        raise RunFileError(f"{name}: cannot be read ({error.strerror or error})") from None
    if len(raw) > limit:
        raise RunFileError(f"{name}: too large (over {limit:,} bytes)")
    return raw


def _no_constant(word: str):
    raise ValueError(f"{word} is not a number a PagedAttention Lab file holds")


def _depth(value) -> int:
    """How deeply lists and objects nest in ``value`` (iterative: no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:
                stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def _check_header(data: dict, fmt: str, name: str) -> None:
    found = data.get("format")
    if found != fmt:
        what = f"format {found!r}" if found is not None else "no \"format\" key"
        raise RunFileError(f"{name}: not a PagedAttention Lab {fmt.split('/')[-1]} file ({what}; expected {fmt!r})")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RunFileError(f"{name}: bad \"version\" {version!r} (a positive integer expected)")
    newest = RUN_VERSION if fmt == RUN_FORMAT else VERSION
    if version > newest:
        raise RunFileError(f"{name}: version {version} was written by a newer PagedAttention Lab; this one reads version {newest}")


def _workload(data: dict, name: str) -> Workload:
    requests = _requests(data.get("requests"), name)
    return Workload(requests=requests, settings=_settings(data.get("settings", {}), name, len(requests)))


def _requests(rows, name: str) -> list[WorkloadRequest]:
    if not isinstance(rows, list) or not rows:
        raise RunFileError(f"{name}: \"requests\" must be a non-empty list")
    requests = []
    for i, row in enumerate(rows):
        prompt = row.get("prompt") if isinstance(row, dict) else None
        max_tokens = row.get("max_tokens") if isinstance(row, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise RunFileError(f"{name}: request {i}: \"prompt\" must be a non-empty string")
        if not _is_utf8(prompt):
            raise RunFileError(f"{name}: request {i}: \"prompt\" has a lone surrogate (it cannot be UTF-8)")
        if not _is_int(max_tokens) or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
            raise RunFileError(f"{name}: request {i}: \"max_tokens\" must be an integer from 1 to {MAX_TOKENS_LIMIT}, "
                               f"got {short_repr(max_tokens)}")
        requests.append(WorkloadRequest(prompt, max_tokens))
    return requests


def _settings(raw, name: str, num_requests: int = 1) -> dict:
    if not isinstance(raw, dict):
        raise RunFileError(f"{name}: \"settings\" must be an object")
    settings = dict(SETTINGS_DEFAULTS)
    for key, default in SETTINGS_DEFAULTS.items():
        if key not in raw:
            continue
        value = raw[key]
        if key in _OPTIONAL_INTS:
            ok = value is None or (_is_int(value) and 1 <= value <= SETTING_LIMITS[key])
            want = f"null or an integer from 1 to {SETTING_LIMITS[key]}"
        elif key == "enable_prefix_caching":
            ok, want = value is None or isinstance(value, bool), "true, false or null"
        elif key == "temperature":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
                and 0 <= value <= SETTING_LIMITS[key]
            want = f"a number from 0 (greedy) to {SETTING_LIMITS[key]:g}"
            value = float(value) if ok else value
        elif isinstance(default, bool):
            ok, want = isinstance(value, bool), "true or false"
        elif isinstance(default, int):  # seed and num_speculative_tokens >= 0, block_size and max_num_seqs >= 1
            low, high = (0, SETTING_LIMITS[key] - (num_requests - 1)) if key == "seed" else (0 if key == "num_speculative_tokens" else 1, SETTING_LIMITS[key])
            ok, want = _is_int(value) and low <= value <= high, f"an integer from {low} to {high}"
        elif key in SETTING_CHOICES:
            ok, want = value in SETTING_CHOICES[key], "one of " + ", ".join(map(repr, SETTING_CHOICES[key]))
        else:  # model: a name (the app takes only its own default model from a file; see app_pages/saved.py)
            ok, want = isinstance(value, str) and value.strip() != "" and len(value) <= 4096, "a model name"
        if not ok:
            raise RunFileError(f"{name}: setting \"{key}\" has a bad value {short_repr(value)} ({want} expected)")
        settings[key] = value
    if settings["num_gpu_blocks"] is not None and settings["kv_cache_memory"] is not None:
        raise RunFileError(f"{name}: give either \"num_gpu_blocks\" or \"kv_cache_memory\", not both")
    return settings


def short_repr(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (a 4,000-digit number or a long string stays readable)."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for repr
        return f"an integer of {value.bit_length()} bits"
    return text if len(text) <= limit else text[: limit - 3] + "..."
