"""``python -m engine replay --against vllm WORKLOAD.json``: one saved workload through the engine and real vLLM.

The workload is the app's saved workload file (engine/runfile.py: settings + chat prompts with
max_tokens). Both sides get the same prompt token ids (the chat template applied once, by the
engine), the same sampling (request *i* seeded ``seed + i``) and the same scheduler settings:
block size, a pool of the same usable blocks (vLLM +1 for its null block), max_num_seqs,
max_num_batched_tokens, max_model_len, prefix caching and chunked prefill off unless asked (then on
on both sides). All requests arrive at step 0.

Side by side: outputs identical (count, first differences with the logit margin), steps, preemptions,
peak and mean KV usage (fraction of the pool's usable blocks, after each step), prefix-cache hits
(tokens; vLLM's own stats). Every difference is either explained by one of
:data:`engine.vllm_bridge.compare.KNOWN_DIFFERENCES` that applies to the run, or listed as unexplained.
"""

from __future__ import annotations

import math
from pathlib import Path

from engine.runfile import short_repr
from engine.vllm_bridge.compare import (
    KNOWN_DIFFERENCES, KV_CACHE_GIB, VLLM_BLOCK_MULTIPLE, compare_outputs, known_difference, vllm_min_blocks,
)

NUMERICS_MARGIN = 0.05  # logits: below this, a float32 kernel difference can flip a greedy choice
METRICS = ("num_steps", "num_preemptions", "peak_kv_usage", "mean_kv_usage", "prefix_cache_hits")


def replay_settings(
    settings: dict, block_size: int | None = None, max_num_batched_tokens: int | None = None,
    prefix_caching: bool = False, chunked_prefill: bool = False, ignore_eos: bool = False,
) -> tuple[dict, list[str]]:
    """The settings both sides run with, from a workload's settings and the command's options.

    Returns:
        (settings, notes): ``settings`` holds model, block_size, workload_block_size (the file's), num_gpu_blocks (the engine's, or
        None with kv_cache_memory), kv_cache_memory, max_num_seqs, max_num_batched_tokens (None =
        the engine's default), enable_prefix_caching, enable_chunked_prefill, ignore_eos,
        temperature, seed; ``notes`` name each change from the file and the known difference behind it.

    Raises:
        ValueError: block_size is given and is not a positive integer.
    """
    notes = []
    size = workload_block_size = settings.get("block_size", 16)
    blocks = settings.get("num_gpu_blocks")
    if block_size is not None:
        if block_size < 1:
            raise ValueError(f"--block-size must be a positive integer, got {block_size}")
        if blocks is not None:
            blocks = math.ceil(blocks * size / block_size)
        size = block_size
    elif size % VLLM_BLOCK_MULTIPLE:
        new = VLLM_BLOCK_MULTIPLE * math.ceil(size / VLLM_BLOCK_MULTIPLE)
        if blocks is not None:
            blocks = math.ceil(blocks * size / new)
        notes.append(f"block_size {size} -> {new} on both sides, pool kept at {blocks * new if blocks else 'the same'} slots "
                     f"[{known_difference('block_size').key}]")
        size = new
    if settings.get("allocator", "paged") != "paged":
        notes.append(f"allocator {settings['allocator']!r} -> 'paged': vLLM has only the paged one")
    return {
        "model": settings.get("model"), "block_size": size, "workload_block_size": workload_block_size, "num_gpu_blocks": blocks,
        "kv_cache_memory": settings.get("kv_cache_memory") if blocks is None else None,
        "max_num_seqs": settings.get("max_num_seqs", 8), "max_num_batched_tokens": max_num_batched_tokens,
        "enable_prefix_caching": prefix_caching, "enable_chunked_prefill": chunked_prefill,
        "ignore_eos": ignore_eos, "temperature": float(settings.get("temperature", 0.0)), "seed": settings.get("seed", 0),
    }, notes


def make_engine(settings: dict, loaded_model=None):
    """The lab's engine for these replay settings (paged, float32 as vLLM's side, on CUDA too);
    ``loaded_model``: the model already loaded (``engine.model_executor.model_loader``'s), to share its tensors."""
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.runfile import DEFAULT_MODEL

    model = None if settings["model"] in (None, DEFAULT_MODEL) else settings["model"]
    return LLMEngine(EngineConfig(
        model=model, block_size=settings["block_size"], num_gpu_blocks=settings["num_gpu_blocks"],
        kv_cache_memory=settings["kv_cache_memory"], max_num_seqs=settings["max_num_seqs"],
        max_num_batched_tokens=settings["max_num_batched_tokens"], seed=settings["seed"], dtype="float32",
        enable_prefix_caching=settings["enable_prefix_caching"], enable_chunked_prefill=settings["enable_chunked_prefill"],
    ), loaded_model=loaded_model)


def sampling(settings: dict, requests) -> list[dict]:
    """Per request: max_tokens, temperature, ignore_eos and seed (``seed + i``, the workload format's rule)."""
    return [{"max_tokens": r.max_tokens, "temperature": settings["temperature"], "ignore_eos": settings["ignore_eos"],
             "seed": settings["seed"] + i} for i, r in enumerate(requests)]


def run_engine(engine, prompt_ids: list[list[int]], params: list[dict]) -> dict:
    """Run every request on the engine (all at step 0); {"token_ids", "steps", "metrics"} in the
    units of vLLM's runner (engine/vllm_bridge/runner.py), so that :func:`compare_replay` can set them side by side."""
    from engine.sampling_params import SamplingParams

    ids = [engine.add_request(p, SamplingParams(**k)) for p, k in zip(prompt_ids, params)]
    steps, report = [], None
    queried = hit = 0
    while engine.has_unfinished_requests():
        report = engine.step()
        if report.phase == "idle":
            continue
        m = report.memory
        step = {"num_running": len(engine.scheduler.running), "num_waiting": len(engine.scheduler.waiting),
                "kv_cache_usage": 1 - m.free / m.capacity, "num_preempted": len(report.preempted),
                "num_scheduled_tokens": report.num_tokens}
        if report.kv_groups:  # a hybrid model: each KV cache group's blocks in use (their sum is the pool's)
            step["group_blocks_in_use"] = [g.num_blocks_in_use for g in report.kv_groups]
        if report.prefix_cache is not None:  # this step's lookups, in tokens, as vLLM's per-step stats give them
            step["prefix_cache_queries"] = report.prefix_cache.queries - queried
            step["prefix_cache_hits"] = report.prefix_cache.hits - hit
            queried, hit = report.prefix_cache.queries, report.prefix_cache.hits
        steps.append(step)
    metrics = {
        **run_metrics(steps),
        # Hits of first prefills, in tokens (re-prefills after a preemption are counted apart, as vLLM does).
        "prefix_cache_hits": report.prefix_cache.hits if report is not None and report.prefix_cache is not None else None,
    }
    return {"token_ids": [engine.get_output(i).token_ids for i in ids], "steps": steps, "metrics": metrics}


def run_metrics(steps: list[dict]) -> dict:
    """num_steps, num_preemptions, peak_kv_usage and mean_kv_usage (fractions of the usable blocks) of a per-step series."""
    usage = [s["kv_cache_usage"] for s in steps]
    return {"num_steps": len(steps), "num_preemptions": sum(s["num_preempted"] for s in steps),
            "peak_kv_usage": max(usage, default=0.0), "mean_kv_usage": sum(usage) / len(usage) if usage else 0.0}


STEP_KEYS = ("num_running", "kv_cache_usage", "num_preempted")
SETTING_KEYS = ("block_size", "num_gpu_blocks", "max_num_seqs", "ignore_eos", "temperature", "seed")


RECORDED_WORKLOADS = Path(__file__).resolve().parents[2] / "tests" / "data"  # the recorded replays' workloads
REPLAY_SETTING_LIMITS = {"block_size": (1, 256), "num_gpu_blocks": (1, 1 << 14), "max_num_seqs": (1, 1024),
                         "seed": (0, (1 << 63) - 1)}
REPLAY_OPTIONAL_LIMITS = {"kv_cache_memory": (1, 1 << 30), "max_num_batched_tokens": (1, 1 << 16)}
REPLAY_MAX_SLOTS = 1 << 14  # the pool the app builds for a replay: 16,384 token slots (720 MiB with the default model)


def load_replay(source: str | bytes, name: str = "replay") -> dict:
    """Read a replay file: ``replay --against vllm --json``'s output (both runs' per-step series), or a
    recorded one without the engine's run (tests/data/vllm_replay_*.json).

    A replay file is data: its ``settings.model`` must be the default model (or absent), since a file never
    chooses what the server loads or fetches, and its ``workload`` is only a name (see :func:`workload_file`).

    Returns:
        The file's dict: "settings", "vllm_run" ("token_ids", "steps": per step num_running,
        kv_cache_usage (0..1), num_preempted, ...), optionally "engine_run", "workload", "vllm_version".

    Raises:
        ValueError: not JSON, or a part missing, of the wrong kind or out of range (named, with the step);
            whatever the file holds, never another exception.
    """
    import json

    from engine.runfile import DEFAULT_MODEL, MAX_FILE_BYTES

    if len(source) > MAX_FILE_BYTES:
        raise ValueError(f"{name} is too large ({len(source):,} bytes; at most {MAX_FILE_BYTES:,})")
    try:
        data = json.loads(source, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"{name} is not JSON this reader opens (nested too deeply)") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError, a number of more than 4,300 digits
        raise ValueError(f"{name} is not JSON ({error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("vllm_run"), dict) or not isinstance(data.get("settings"), dict):
        raise ValueError(f"{name} has no 'settings' and 'vllm_run': it is not the output of `replay --against vllm --json`")
    settings = data["settings"]
    missing = [k for k in SETTING_KEYS if k not in settings]
    if missing:
        raise ValueError(f"{name}: settings lack {', '.join(missing)}")
    for key, (low, high) in REPLAY_SETTING_LIMITS.items():
        value = settings[key]
        if key == "num_gpu_blocks" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{name}: settings: {key} is {short_repr(value)}, not an integer from {low} to {high}")
    for key, (low, high) in REPLAY_OPTIONAL_LIMITS.items():
        value = settings.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
            raise ValueError(f"{name}: settings: {key} is {short_repr(value)}, not null or an integer from {low} to {high}")
    for key in ("enable_prefix_caching", "enable_chunked_prefill"):
        if not isinstance(settings.get(key, False), bool):
            raise ValueError(f"{name}: settings: {key} is {short_repr(settings[key])}, not true or false")
    if settings["num_gpu_blocks"] is not None and settings["num_gpu_blocks"] * settings["block_size"] > REPLAY_MAX_SLOTS:
        raise ValueError(f"{name}: settings: a pool of {settings['num_gpu_blocks']} blocks of {settings['block_size']} slots is over "
                         f"the {REPLAY_MAX_SLOTS:,} slots a replay here may use")
    if not isinstance(settings["ignore_eos"], bool):
        raise ValueError(f"{name}: settings: ignore_eos is {short_repr(settings['ignore_eos'])}, not true or false")
    temperature = settings["temperature"]
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 100:
        raise ValueError(f"{name}: settings: temperature is {short_repr(temperature)}, not a number from 0 to 100")
    if settings.get("model") not in (None, DEFAULT_MODEL):
        raise ValueError(f"{name}: settings: model is {short_repr(settings['model'])}; a replay file is data and cannot choose "
                         f"the model this server loads (only {DEFAULT_MODEL!r} is replayed here)")
    if "workload" in data and not isinstance(data["workload"], (str, type(None))):
        raise ValueError(f"{name}: workload is {short_repr(data['workload'])}, not a file name")
    for side in ("vllm_run", "engine_run"):
        if side in data:
            _check_run(data[side], f"{name}: {side}")
    return data


def workload_file(replay: dict) -> Path | None:
    """The recorded workload a replay names, if it is one of the project's (``tests/data/workload_*.json``).

    A replay names its workload by the path it was run with (e.g. ``tests/data/workload_4x16.json``); only
    the file name counts, and only a recorded workload of that name is opened. Any other name (another
    directory, ``../``, ``/etc/passwd``) gives None: the reader opens the workload file themselves.
    """
    named = replay.get("workload")
    if not isinstance(named, str) or not named:
        return None
    base = named.replace("\\", "/").rsplit("/", 1)[-1]
    recorded = {p.name: p for p in RECORDED_WORKLOADS.glob("workload_*.json")}
    return recorded.get(base)


def _no_constant(word: str):
    raise ValueError(f"{word} is not a number a replay file holds")


def _check_run(run, where: str) -> None:
    steps = run.get("steps") if isinstance(run, dict) else None
    if not isinstance(steps, list) or not steps:
        raise ValueError(f"{where} has no per-step 'steps' list")
    token_ids = run.get("token_ids")
    if not isinstance(token_ids, list) or not all(
            isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids) for ids in token_ids):
        raise ValueError(f"{where} has no 'token_ids' list (one list of token ids per request)")
    for i, step in enumerate(steps):
        for key in STEP_KEYS:
            value = step.get(key) if isinstance(step, dict) else None
            high = 1 if key == "kv_cache_usage" else math.inf
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= high:
                raise ValueError(f"{where}, step {i}: {key} is {value!r}, not a number in [0, {high:g}]")


def replay_lab_run(replay: dict, workload) -> dict:
    """The lab's engine on a replay's workload with the replay's settings (``run_engine``'s dict).

    Args:
        replay: :func:`load_replay`'s dict; workload: its ``engine.runfile.Workload``.

    Raises:
        ValueError: the workload's requests are not the replay's (another count).
    """
    count = len(replay["vllm_run"]["token_ids"])
    if len(workload.requests) != count:
        raise ValueError(f"the workload has {len(workload.requests)} requests but the replay {count}: not its workload")
    settings = {"kv_cache_memory": None, "max_num_batched_tokens": None, "enable_prefix_caching": False,
                "enable_chunked_prefill": False, **replay["settings"],
                "model": None}  # the default model: a replay file never chooses what the server loads
    engine = make_engine(settings)
    prompt_ids = [engine.encode([{"role": "user", "content": r.prompt}]) for r in workload.requests]
    return run_engine(engine, prompt_ids, sampling(settings, workload.requests))


def keeps_null_block(engine) -> bool:
    """Whether the engine's pool already keeps block 0 as vLLM's null block: asked for
    (``reserve_null_block``), or a hybrid model's pool, whose sliding-window tables need it."""
    return bool(engine.config.reserve_null_block or engine.kv_cache_config is not None)  # None: one group, not hybrid


def vllm_job(engine, model_dir, prompt_ids: list[list[int]], params: list[dict], settings: dict) -> dict:
    """The runner's job: the engine's effective pool and limits, vLLM's null block added where the engine's
    pool has none (:func:`keeps_null_block`), so that both sides have the same usable blocks.

    vLLM's ``max_model_len`` is the longest request of the workload (at most the engine's): it sets no
    schedule, but vLLM starts only when one request of that length fits its pool (:func:`vllm_min_blocks`).

    Raises:
        ValueError: vLLM would refuse the pool: the message says how many blocks it needs.
    """
    longest = max((len(p) + k["max_tokens"] for p, k in zip(prompt_ids, params)), default=1)
    max_model_len = min(engine.max_model_len, longest)
    num_blocks = engine.num_blocks + (0 if keeps_null_block(engine) else 1)
    needed = vllm_min_blocks(engine, settings["block_size"], engine.scheduler.max_num_batched_tokens, max_model_len)
    if num_blocks < needed:
        raise ValueError(f"vLLM starts only with room for one request of {max_model_len} tokens: {needed - 1} usable blocks "
                         f"of {settings['block_size']} (the workload gives {num_blocks - 1})")
    return {
        "model": str(model_dir), "dtype": "float32", "block_size": settings["block_size"],
        "num_gpu_blocks": num_blocks, "max_num_seqs": settings["max_num_seqs"],
        "max_num_batched_tokens": engine.scheduler.max_num_batched_tokens, "max_model_len": max_model_len,
        "enable_prefix_caching": settings["enable_prefix_caching"], "enable_chunked_prefill": settings["enable_chunked_prefill"],
        "seed": settings["seed"], "requests": [dict(k, prompt_token_ids=p) for p, k in zip(prompt_ids, params)],
    }


def compare_replay(engine_run: dict, vllm_run: dict, settings: dict, margin=None) -> dict:
    """Set both runs side by side and explain each difference.

    Args:
        engine_run: :func:`run_engine`'s result; vllm_run: the runner's replay reply ("token_ids",
            "metrics"), e.g. recorded in a JSON file.
        settings: :func:`replay_settings`'s.
        margin: ``(request, position) -> top-2 logit margin`` for differing greedy outputs.

    Returns:
        {"outputs": :func:`~engine.vllm_bridge.compare.compare_outputs`'s dict, "engine", "vllm" (metrics:
        num_steps, num_preemptions, peak_kv_usage, mean_kv_usage, prefix_cache_hits), "differences"
        (the known differences that apply: key, text, test), "unexplained" (lines; empty when every
        difference is explained)}.
    """
    outputs = compare_outputs(engine_run["token_ids"], vllm_run["token_ids"], margin if settings["temperature"] == 0 else None)
    applies = {"null_block"}
    unexplained = []
    if not outputs["identical"]:
        if settings["temperature"] > 0:
            applies.add("sampling")
        elif all(d["top2_logit_margin"] is not None and d["top2_logit_margin"] < NUMERICS_MARGIN for d in outputs["first_differences"]):
            applies.add("numerics")
        else:
            unexplained.append(f"{outputs['num_requests'] - outputs['num_identical']} greedy outputs differ "
                               f"where the top-2 logit margin is not below {NUMERICS_MARGIN}")
    ours, theirs = engine_run["metrics"], vllm_run["metrics"]
    reasons = [k for k in ("prefix_caching", "chunked_prefill") if settings[f"enable_{k}"]]
    applies.update(reasons)
    if settings["enable_prefix_caching"] and ours.get("prefix_cache_hits") != theirs.get("prefix_cache_hits"):
        applies.add("same_step_hits")
    same_lengths = outputs["identical"] or settings["ignore_eos"]  # else a stop at another token changes the schedule
    if not reasons and same_lengths:  # same requests, same policy: the schedules must be the same
        for key in ("num_steps", "num_preemptions", "peak_kv_usage", "mean_kv_usage"):
            if not math.isclose(ours[key], theirs[key], abs_tol=1e-9):
                unexplained.append(f"{key}: engine {ours[key]:g}, vLLM {theirs[key]:g}")
    if settings["block_size"] != settings["workload_block_size"]:
        applies.add("block_size")
    differences = [{"key": d.key, "text": d.text, "test": d.test} for d in KNOWN_DIFFERENCES if d.key in applies]
    return {"outputs": outputs, "engine": ours, "vllm": theirs, "differences": differences, "unexplained": unexplained}


def run_replay(path: str | Path, vllm_python: str | None = None, progress=lambda line: None, **options) -> dict:
    """Replay a saved workload file through the engine and vLLM; :func:`compare_replay`'s dict plus
    "workload", "settings", "notes", "vllm_version", "vllm_settings" (as vLLM took them), "vllm_load_s",
    and both runs: "engine_run" and "vllm_run" with token_ids and per-step "steps" (num_running,
    num_waiting, kv_cache_usage, num_preempted, ...), vLLM's also with its "metrics".

    Args:
        progress: called with a line of text at each stage.
        options: :func:`replay_settings`'s keyword arguments.

    Raises:
        engine.runfile.RunFileError: the file is not a readable workload (a ValueError, named).
        engine.vllm_bridge.env.VLLMUnavailable: vLLM cannot run here (says why).
    """
    from engine.model_executor.model_loader import resolve_model
    from engine.runfile import load_workload
    from engine.vllm_bridge.env import resolve_python
    from engine.vllm_bridge.process import VLLMProcess

    workload = load_workload(path)
    settings, notes = replay_settings(workload.settings, **options)
    python = resolve_python(vllm_python)
    engine = make_engine(settings)
    prompt_ids = [engine.encode([{"role": "user", "content": r.prompt}]) for r in workload.requests]
    params = sampling(settings, workload.requests)
    kv_gib = max(KV_CACHE_GIB, 1.2 * (engine.num_blocks + 1) * settings["block_size"] * engine.bytes_per_slot / 2**30)
    model_dir = resolve_model(engine.config.model)
    with VLLMProcess(python, vllm_job(engine, model_dir, prompt_ids, params, settings), kv_gib) as vllm:
        engine_run = run_engine(engine, prompt_ids, params)  # while vLLM loads
        progress("engine done; waiting for vLLM to load (it compiles the model at every start: 1-2 min, more on a busy machine)")
        ready = vllm.wait_ready()
        vllm_run = vllm.replay()
    result = compare_replay(engine_run, vllm_run, settings, _margin_fn(model_dir, prompt_ids, engine_run["token_ids"]))
    return {"workload": str(path), "settings": settings, "notes": notes, "vllm_version": ready["vllm_version"],
            "vllm_settings": ready["settings"], "vllm_load_s": ready["load_s"], **result,
            "engine_run": {k: engine_run[k] for k in ("token_ids", "steps")},
            "vllm_run": {k: vllm_run[k] for k in ("token_ids", "steps", "metrics")}}


def _margin_fn(model_dir, prompt_ids, token_ids):
    """Top-2 logit margin at a position of the engine's output, by transformers (loaded on first use)."""
    cache = {}

    def margin(request: int, pos: int) -> float:
        import torch
        import transformers

        from engine.tools.precision import top2_margin

        if "hf" not in cache:
            cache["hf"] = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        return top2_margin(cache["hf"], prompt_ids[request] + token_ids[request][:pos])

    return margin


def format_replay(r: dict) -> str:
    """The replay side by side, as printed by the command."""
    o = r["outputs"]
    s = r["settings"]
    lines = [
        f"replay of {r['workload']}: {o['num_requests']} requests, block_size {s['block_size']}, max_num_seqs {s['max_num_seqs']}, "
        f"prefix caching {'on' if s['enable_prefix_caching'] else 'off'}, chunked prefill {'on' if s['enable_chunked_prefill'] else 'off'} "
        f"(vLLM {r['vllm_version']}: {r['vllm_settings']['num_gpu_blocks']} blocks incl. its null block)",
        *[f"note: {n}" for n in r["notes"]],
        f"outputs identical: {o['num_identical']}/{o['num_requests']}",
    ]
    for d in o["first_differences"][:5]:
        margin = "" if d["top2_logit_margin"] is None else f", top-2 logit margin {d['top2_logit_margin']:.4g}"
        lines.append(f"  request {d['request']}: first difference at token {d['position']} "
                     f"(engine {d['engine_token']}, vLLM {d['vllm_token']}{margin})")
    lines.append(f"{'':22s}{'engine':>10s}{'vLLM':>10s}")
    for key, label in zip(METRICS, ("steps", "preemptions", "peak KV usage", "mean KV usage", "prefix-cache hits")):
        lines.append(f"{label:22s}{_cell(r['engine'][key]):>10s}{_cell(r['vllm'][key]):>10s}")
    lines += [f"known difference [{d['key']}]: {d['text']}" for d in r["differences"]]
    lines += [f"UNEXPLAINED: {u}" for u in r["unexplained"]] or ["every difference is explained by a known one"]
    return "\n".join(lines)


def _cell(value) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1%}" if isinstance(value, float) else str(value)
