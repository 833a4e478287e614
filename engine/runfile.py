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

A **run file** (format ``"pagedattention-lab/run"``, version 1) is a whole run, to replay it later
without the model: the same ``settings`` and ``requests`` as a workload file, plus

- ``engine``: ``model_name``, ``block_size`` (slots per block), ``num_blocks``, ``bytes_per_slot``
  (bytes of one token's K and V over all layers);
- ``prompts``: per request id (a JSON string key), the prompt text as the app shows it;
- ``steps``: every kept :class:`~engine.report.StepReport`, in order, each written field by field
  (``dataclasses.asdict``: nested Event, BlockTableSnapshot, ScheduledRequest and MemoryUsage become
  objects, dict keys become strings). Fields added to StepReport later are written the same way;
  on load, fields the reader's StepReport does not have are ignored, and missing ones take their
  defaults (a missing field without a default is an error).

Every error is a :class:`RunFileError` (a ``ValueError``) that starts with the file's name.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

WORKLOAD_FORMAT = "pagedattention-lab/workload"
RUN_FORMAT = "pagedattention-lab/run"
VERSION = 1

DEFAULT_MODEL = "SmolLM2-135M-Instruct"  # engine.model_executor.model_loader.DEFAULT_MODEL (not imported: no torch here)
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
}
_OPTIONAL_INTS = ("num_gpu_blocks", "kv_cache_memory", "max_num_batched_tokens")


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
        RunFileError: not JSON, another format, a newer version, or a bad setting or request (named).
    """
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
    """The run as the JSON text of a version-1 run file (module docstring)."""
    data = _workload_dict(run.workload, RUN_FORMAT)
    data["engine"] = {k: run.engine[k] for k in ENGINE_KEYS}
    data["prompts"] = {str(k): v for k, v in run.prompts.items()}
    data["steps"] = [dataclasses.asdict(r) for r in run.steps]
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def load_run(source: str | Path | bytes, name: str | None = None) -> Run:
    """Read a run file (a path, or bytes with ``name``); the step reports come back as StepReports.

    Raises:
        RunFileError: not JSON, another format, a newer version, or a bad field (named).
    """
    from engine.report import StepReport  # here, so that workload files need nothing but the standard library

    data, name = _read(source, name)
    _check_header(data, RUN_FORMAT, name)
    workload = _workload(data, name)
    engine = data.get("engine")
    if not isinstance(engine, dict) or any(not _is_int(engine.get(k)) for k in ENGINE_KEYS[1:]):
        raise RunFileError(f"{name}: \"engine\" must hold integers {', '.join(ENGINE_KEYS[1:])}")
    prompts = data.get("prompts")
    if not isinstance(prompts, dict) or not all(k.isdigit() and isinstance(v, str) for k, v in prompts.items()):
        raise RunFileError(f"{name}: \"prompts\" must map request ids to prompt texts")
    steps = data.get("steps")
    if not isinstance(steps, list) or not steps:
        raise RunFileError(f"{name}: \"steps\" must be a non-empty list of step reports")
    reports = []
    for i, step in enumerate(steps):
        try:
            reports.append(from_json(StepReport, step))
        except (TypeError, ValueError, KeyError) as error:
            raise RunFileError(f"{name}: step {i}: {error}") from None
    engine = {k: engine.get(k) for k in ENGINE_KEYS}
    return Run(workload, engine, {int(k): v for k, v in prompts.items()}, reports)


def load_any(source: str | Path | bytes, name: str | None = None) -> Workload | Run:
    """A workload file or a run file, whichever ``source`` is (by its ``format``)."""
    data, _ = _read(source, name)
    if data.get("format") == RUN_FORMAT:
        return load_run(source, name)
    return load_workload(source, name)


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
        return int(value) if isinstance(value, str) and value.lstrip("-").isdigit() else _expect(value, int)
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
        try:
            raw = Path(source).read_bytes()
        except OSError as error:
            raise RunFileError(f"{name}: cannot be read ({error.strerror or error})") from None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunFileError(f"{name}: not a JSON file ({error})") from None
    if not isinstance(data, dict):
        raise RunFileError(f"{name}: not a PagedAttention Lab file (a JSON object with \"format\" and \"version\" expected)")
    return data, name


def _check_header(data: dict, fmt: str, name: str) -> None:
    found = data.get("format")
    if found != fmt:
        what = f"format {found!r}" if found is not None else "no \"format\" key"
        raise RunFileError(f"{name}: not a PagedAttention Lab {fmt.split('/')[-1]} file ({what}; expected {fmt!r})")
    version = data.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RunFileError(f"{name}: bad \"version\" {version!r} (a positive integer expected)")
    if version > VERSION:
        raise RunFileError(f"{name}: version {version} was written by a newer PagedAttention Lab; this one reads version {VERSION}")


def _workload(data: dict, name: str) -> Workload:
    return Workload(requests=_requests(data.get("requests"), name), settings=_settings(data.get("settings", {}), name))


def _requests(rows, name: str) -> list[WorkloadRequest]:
    if not isinstance(rows, list) or not rows:
        raise RunFileError(f"{name}: \"requests\" must be a non-empty list")
    requests = []
    for i, row in enumerate(rows):
        prompt = row.get("prompt") if isinstance(row, dict) else None
        max_tokens = row.get("max_tokens") if isinstance(row, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise RunFileError(f"{name}: request {i}: \"prompt\" must be a non-empty string")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise RunFileError(f"{name}: request {i}: \"max_tokens\" must be an integer >= 1, got {max_tokens!r}")
        requests.append(WorkloadRequest(prompt, max_tokens))
    return requests


def _settings(raw, name: str) -> dict:
    if not isinstance(raw, dict):
        raise RunFileError(f"{name}: \"settings\" must be an object")
    settings = dict(SETTINGS_DEFAULTS)
    for key, default in SETTINGS_DEFAULTS.items():
        if key not in raw:
            continue
        value = raw[key]
        if key in _OPTIONAL_INTS:
            ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0)
        elif key == "enable_prefix_caching":
            ok = value is None or isinstance(value, bool)
        elif key == "temperature":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            value = float(value) if ok else value
        elif isinstance(default, bool):
            ok = isinstance(value, bool)
        elif isinstance(default, int):  # seed >= 0, block_size and max_num_seqs >= 1
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= (0 if key == "seed" else 1)
        else:
            ok = isinstance(value, str) and value != ""
        if not ok:
            raise RunFileError(f"{name}: setting \"{key}\" has a bad value {value!r}")
        settings[key] = value
    if settings["num_gpu_blocks"] is not None and settings["kv_cache_memory"] is not None:
        raise RunFileError(f"{name}: give either \"num_gpu_blocks\" or \"kv_cache_memory\", not both")
    return settings
