"""Saved workloads (and, later in this file, saved runs) as small, versioned JSON files.

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

Every error is a :class:`RunFileError` (a ``ValueError``) that starts with the file's name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

WORKLOAD_FORMAT = "pagedattention-lab/workload"
VERSION = 1

DEFAULT_MODEL = "SmolLM2-135M-Instruct"  # engine.model_loader.DEFAULT_MODEL (not imported: no torch here)
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
}
_OPTIONAL_INTS = ("num_gpu_blocks", "kv_cache_memory")


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
        elif key == "temperature":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            value = float(value) if ok else value
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
