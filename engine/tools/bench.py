"""``python -m engine bench``: the engine against transformers ``generate`` on one workload, one process.

Workload "mixed": ``num_prompts`` chat prompts whose max_tokens are spread evenly from ``min_tokens``
to ``max_tokens``, greedy, ignore_eos (so every request runs its full length). The engine batches
continuously: a request leaves the batch as soon as it is done. transformers generates the same
prompts as one left-padded static batch until the longest is done; each of its outputs is cut to
that request's max_tokens. Both count only the tokens asked for, so tokens/s compares like with like.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import time

import numpy as np
import torch
import transformers

from engine.cpu import ops as cpu_ops
from engine.tools import precision, roofline
from engine.config import EngineConfig
from engine.llm import LLM
from engine.model_executor.model_loader import resolve_model
from engine.sampling_params import SamplingParams

# Rest before each side's run, so that none starts while the previous one's process is still winding
# down: right after vLLM's run a 20 ms matmul probe here took 109 ms once, then 30-37 ms, and one engine
# run's first 12 decode steps took 40-57 ms against ~30 ms for the rest. At least SETTLE_S seconds, then
# until the machine's CPUs were busy less than QUIET_CORES cores' worth over QUIET_WINDOW_S (Linux's
# /proc/stat), for at most SETTLE_MAX_S seconds.
SETTLE_S = 0.5
QUIET_CORES = 0.2
QUIET_WINDOW_S = 0.1
SETTLE_MAX_S = 5.0
PROC_STAT = "/proc/stat"

TOPICS = [
    "the water cycle", "how a CPU cache works", "the French revolution", "photosynthesis",
    "why the sky is blue", "a recipe for pancakes", "black holes", "the history of the bicycle",
    "how vaccines work", "the rules of chess", "volcanoes", "how a compiler works",
    "the Great Wall of China", "electric cars", "the stock market", "honey bees",
]


def mixed_workload(num_prompts: int, min_tokens: int, max_tokens: int) -> tuple[list[list[dict]], list[int]]:
    """Chat prompts and their max_tokens, evenly spread from min_tokens to max_tokens (one prompt: max_tokens).

    Raises:
        ValueError: num_prompts < 1, min_tokens < 1, or min_tokens > max_tokens (named as the
            command-line options).
    """
    if num_prompts < 1:
        raise ValueError(f"--num-prompts must be at least 1, got {num_prompts}")
    if min_tokens < 1:
        raise ValueError(f"--min-tokens must be at least 1, got {min_tokens}")
    if min_tokens > max_tokens:
        raise ValueError(f"--min-tokens ({min_tokens}) must not exceed --max-tokens ({max_tokens})")
    prompts = [[{"role": "user", "content": f"Tell me about {TOPICS[i % len(TOPICS)]}."}] for i in range(num_prompts)]
    if num_prompts == 1:
        return prompts, [max_tokens]
    lengths = np.linspace(min_tokens, max_tokens, num_prompts).round().astype(int).tolist()
    return prompts, lengths


def run_bench(
    model: str | None = None, num_prompts: int = 16, min_tokens: int = 8, max_tokens: int = 128,
    block_size: int = 16, seed: int = 0, repeats: int = 3, cpu_kernels: bool = True, dtype: str = "auto",
    against_vllm: bool = False, vllm_python: str | None = None, vllm_block_size: int | None = None,
    prefix_caching: bool = False,
) -> dict:
    """Run the workload through both, in ``dtype`` (auto: fp32 on CPU, bf16 on CUDA); returns the figures as a dict.

    The two sides alternate ``repeats`` times (engine, transformers, engine, ...) after one warm-up
    each, and the medians are reported: on a shared 2-core machine one run can be 20% off, and
    alternating exposes both sides to the same disturbances. Each run starts once the machine is quiet (:func:`settle`).

    Keys: engine_tokens_per_s, hf_tokens_per_s, ratio (median transformers seconds / median engine
    seconds), ratios (per repeat), outputs_identical, mismatches (request, first differing position,
    top-2 logit margin there), engine_seconds, hf_seconds (medians), engine_runs_s, hf_runs_s, tokens,
    engine_decode_step_ms_by_batch (median ms of the engine's decode steps, by how many requests they
    ran), hf_ms_per_step (transformers' median seconds over its max_tokens steps, prefill included, in ms;
    every one of its steps runs the whole batch), engine_cpu_backend (what ran the engine's decode-sized
    batches: its CPU kernels or torch's F.linear, see ``cpu_kernels`` and engine/cpu/ops.py), roofline
    (the fastest engine run's decode steps against this machine's roofline, measured first, after each
    engine run and last, the best of each figure kept: :func:`engine.tools.roofline.decode_report`, plus ``run``,
    its index, ``mean_share_by_run`` and ``mean_tight_share_by_run``, every run's mean shares: best against
    best, as STREAM and the matmul peak keep their best runs, with all runs shown, and ``peak_samples``,
    every measurement of the machine as a :class:`~engine.tools.roofline.MachinePeaks` dict), prefill (every
    engine run's prefill steps against the matmul peak: :func:`engine.tools.roofline.prefill_report`), fp32_agreement (not float32 only: the engine's tokens
    against a float32 engine's, :func:`engine.tools.precision.fp32_agreement`).

    ``prefix_caching``: automatic prefix caching on the engine and on vLLM alike (transformers has
    none); off by default on both. The workload repeats the same prompts (a warm-up, then every run),
    so with it on every full block of every prompt is a hit from the warm-up on: 512 of the 596 prompt
    tokens were read from the cache in each run, and the prefill computed 84: a comparison with it on
    for one side only measures the cache, not the engine. Keys:
    prefix_caching (the setting), engine_prefix_cache_hits (prompt tokens the engine found cached, all
    measured runs together; 0 with it off).

    ``against_vllm``: real vLLM as a third side in the same alternation (engine, transformers,
    vLLM, ...; engine/vllm_bridge/compare.py), at ``vllm_block_size`` (default 32, the smallest its CPU
    attention takes); adds the keys of :meth:`~engine.vllm_bridge.compare.VLLMBenchSide.figures`.

    Raises:
        ValueError: repeats < 1, or a workload :func:`mixed_workload` refuses (checked before loading anything).
        engine.vllm_bridge.env.VLLMUnavailable: against_vllm where vLLM cannot run (says why).
    """
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    prompts, lengths = mixed_workload(num_prompts, min_tokens, max_tokens)
    torch.manual_seed(seed)
    settings = dict(block_size=block_size, seed=seed, max_num_seqs=num_prompts, cpu_kernels=cpu_kernels, enable_prefix_caching=prefix_caching)
    llm = LLM(model, dtype=dtype, **settings)
    engine = llm.engine
    # The machine's own limits, the matmul peak in the model's dtype: before vLLM and transformers run,
    # right after each engine run, and at the end (vLLM's process is gone by then); the best of each
    # figure, as STREAM keeps its best run. On a shared machine one measurement can be far low (23.5
    # against 29.1 GB/s in two quiet runs on one VM; 41.0 against 58.4 GB/s in two benches of one hour on
    # another), which would flatter every step's share: two samples were too few to find the machine's
    # best. On its own random stream: the seeded one is the workload's.
    samples = [_measure(engine.dtype)]
    prompt_ids = [engine.encode(p) for p in prompts]
    vllm = _vllm_side(llm, model, prompt_ids, lengths, vllm_python, vllm_block_size, prefix_caching) if against_vllm else None
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    hf = transformers.AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=engine.dtype).to(engine.device).eval()
    hf_inputs = _hf_inputs(engine.tokenizer, prompt_ids, engine.device)
    # Warm-up on the full batch, both sides: the first steps of a process pay for fresh memory pages
    # (the allocator has not settled yet), which is not what we measure.
    llm.generate(prompt_ids, SamplingParams(max_tokens=4, ignore_eos=True))
    _hf_generate(hf, hf_inputs, 4)
    if vllm:
        vllm.warm_up()
    engine_runs, hf_runs = [], []
    hits_before = _prefix_cache_hits(engine)
    decode_ms: dict[int, list[float]] = {}  # decode batch size -> each such step's wall time
    run_steps: list[list[tuple[float, list[int]]]] = []  # per engine run: each decode step's (ms, context lengths)
    run_prefills: list[list[tuple[float, list[tuple[int, int]]]]] = []  # per engine run: each prefill step's (ms, (tokens, context))

    def record(report) -> None:
        if report.phase == "prefill":
            run_prefills[-1].append((report.timings_ms["total"], [(s.num_tokens, s.context_len) for s in report.scheduled]))
        if report.phase == "decode":
            decode_ms.setdefault(len(report.scheduled), []).append(report.timings_ms["total"])
            run_steps[-1].append((report.timings_ms["total"], [s.context_len for s in report.scheduled]))

    for _ in range(repeats):
        run_steps.append([])
        run_prefills.append([])
        settle()
        t0 = time.perf_counter()
        outputs = llm.generate(prompt_ids, params, on_step=record)
        engine_runs.append(time.perf_counter() - t0)
        samples.append(_measure(engine.dtype))  # what the machine gave at the time of this run
        settle()
        t0 = time.perf_counter()
        hf_outputs = _hf_generate(hf, hf_inputs, max(lengths))
        hf_runs.append(time.perf_counter() - t0)
        if vllm:
            settle()
            vllm.run()
    mismatches = []
    for i, (out, n) in enumerate(zip(outputs, lengths)):
        theirs = hf_outputs[i][:n]
        if out.token_ids != theirs:
            pos = next(j for j, (a, b) in enumerate(zip(out.token_ids, theirs)) if a != b)
            margin = precision.top2_margin(hf, prompt_ids[i] + out.token_ids[:pos])
            mismatches.append({"request": i, "position": pos, "top2_logit_margin": margin})
    tokens = sum(lengths)
    engine_s, hf_s = statistics.median(engine_runs), statistics.median(hf_runs)
    extra = {}
    if engine.dtype != torch.float32:
        hf32 = transformers.AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=torch.float32).to(engine.device).eval()
        extra["fp32_agreement"] = precision.fp32_agreement(model, prompt_ids, params, [o.token_ids for o in outputs], hf32, **settings)
    result = extra | {
        "workload": "mixed", "num_prompts": num_prompts, "tokens": tokens, "device": str(engine.device),
        "dtype": str(engine.dtype).replace("torch.", ""), "repeats": repeats, "engine_cpu_backend": engine.cpu_backend,
        "isa": cpu_ops.isa_report(),
        "engine_seconds": engine_s, "hf_seconds": hf_s, "engine_runs_s": engine_runs, "hf_runs_s": hf_runs,
        "engine_tokens_per_s": tokens / engine_s, "hf_tokens_per_s": tokens / hf_s,
        "ratio": hf_s / engine_s, "ratios": [h / e for e, h in zip(engine_runs, hf_runs)],
        "outputs_identical": not mismatches, "mismatches": mismatches,
        "engine_decode_step_ms_by_batch": {b: statistics.median(v) for b, v in sorted(decode_ms.items(), reverse=True)},
        "hf_ms_per_step": 1e3 * hf_s / max(lengths),
        "prefix_caching": prefix_caching, "engine_prefix_cache_hits": _prefix_cache_hits(engine) - hits_before,
    }
    if vllm:
        margin = lambda i, pos: precision.top2_margin(hf, prompt_ids[i] + outputs[i].token_ids[:pos])  # noqa: E731
        result.update(vllm.figures(tokens, engine_runs, [o.token_ids for o in outputs], margin), block_size=block_size)
        vllm.close()
    samples.append(_measure(engine.dtype))
    peaks = functools.reduce(_best, samples)
    fastest = min(range(repeats), key=engine_runs.__getitem__)
    reports = [roofline.decode_report(engine.runner.model, steps, peaks) for steps in run_steps]
    result["roofline"] = reports[fastest] | {"run": fastest, "mean_share_by_run": [r["mean_share"] for r in reports],
                                             "mean_tight_share_by_run": [r["mean_tight_share"] for r in reports],
                                             "peak_samples": [dataclasses.asdict(s) for s in samples]}
    result["prefill"] = roofline.prefill_report(engine.runner.model, [step for run in run_prefills for step in run], peaks)
    return result


def _measure(dtype: torch.dtype) -> roofline.MachinePeaks:
    """:func:`engine.tools.roofline.measure_machine` in ``dtype``, on its own random stream (the workload's stays untouched)."""
    with torch.random.fork_rng():
        return roofline.measure_machine(dtype=dtype)


def settle() -> float:
    """Wait until the machine is quiet before a side's run (see ``SETTLE_S``); returns the seconds waited.
    Where /proc/stat cannot be read (not Linux), only ``SETTLE_S``."""
    t0 = time.perf_counter()
    time.sleep(SETTLE_S)
    before = _cpu_busy_s()
    while before is not None and time.perf_counter() - t0 < SETTLE_MAX_S:
        time.sleep(QUIET_WINDOW_S)
        now = _cpu_busy_s()
        if now is None or now - before < QUIET_CORES * QUIET_WINDOW_S:
            break
        before = now
    return time.perf_counter() - t0


def _cpu_busy_s() -> float | None:
    """Seconds all CPUs together have spent busy (not idle, not waiting for I/O) since boot; None: unknown."""
    try:
        with open(PROC_STAT) as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _prefix_cache_hits(engine) -> int:
    stats = engine.prefix_cache_stats()
    return stats.hits if stats else 0


def _vllm_side(llm, model, prompt_ids, lengths, vllm_python, vllm_block_size, prefix_caching):
    from engine.vllm_bridge.compare import VLLM_BENCH_BLOCK_SIZE, VLLM_BLOCK_MULTIPLE, VLLMBenchSide
    from engine.vllm_bridge.env import resolve_python

    block_size = vllm_block_size or VLLM_BENCH_BLOCK_SIZE
    if vllm_python is None and block_size % VLLM_BLOCK_MULTIPLE:
        raise ValueError(f"--block-size {block_size}: vLLM's CPU build takes multiples of {VLLM_BLOCK_MULTIPLE} only")
    engine = llm.engine
    return VLLMBenchSide(
        resolve_python(vllm_python), resolve_model(model), prompt_ids, lengths, block_size,
        engine.num_blocks * engine.config.block_size, engine.scheduler.max_num_seqs,
        engine.scheduler.max_num_batched_tokens, engine.max_model_len, str(engine.dtype).replace("torch.", ""),
        enable_prefix_caching=prefix_caching,
    )


def _hf_inputs(tokenizer, prompt_ids: list[list[int]], device) -> dict:
    """One left-padded batch: input_ids and attention_mask ``[num_prompts, longest prompt]`` int64."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompt_ids)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=device)
    return {"input_ids": ids, "attention_mask": mask, "pad_token_id": pad}


@torch.inference_mode()
def _hf_generate(hf, inputs: dict, max_new: int) -> list[list[int]]:
    """transformers ``generate``, greedy, no EOS; returns only the new token ids per prompt."""
    # No EOS at all (ignore_eos): passing eos_token_id=None would fall back to the model's default.
    hf.generation_config.eos_token_id = None
    out = hf.generate(**inputs, max_new_tokens=max_new, do_sample=False, temperature=None, top_p=None, top_k=None)
    return out[:, inputs["input_ids"].shape[1] :].tolist()


def format_result(r: dict) -> str:
    lines = [
        f"workload mixed: {r['num_prompts']} chat prompts, {r['tokens']} generated tokens, greedy, ignore_eos, {r['dtype']} on {r['device']}",
        f"measured on: {cpu_ops.describe_isa(r['isa'])}",
        f"engine (continuous batching, paged KV): {r['engine_seconds']:.2f} s  {r['engine_tokens_per_s']:.1f} tokens/s   (CPU ops: {r['engine_cpu_backend']})",
        f"transformers generate (static batch):   {r['hf_seconds']:.2f} s  {r['hf_tokens_per_s']:.1f} tokens/s",
        f"engine speed-up (transformers seconds / engine seconds): {r['ratio']:.2f}x   outputs identical: {r['outputs_identical']}",
    ]
    if "prefix_caching" in r:
        lines.append(f"prefix caching: on for the engine and vLLM alike (transformers has none); the engine found "
                     f"{r['engine_prefix_cache_hits']} prompt tokens cached over the runs" if r["prefix_caching"] else
                     "prefix caching: off on every side (--prefix-caching turns it on for the engine and vLLM alike)")
    if r["repeats"] > 1:
        runs = ", ".join(f"{x:.2f}x" for x in r["ratios"])
        lines[1:1] = [f"(times are medians of {r['repeats']} alternating runs, the speed-up their ratio; per-run speed-ups: {runs})"]
    by_batch = r["engine_decode_step_ms_by_batch"]
    if by_batch:
        shown = ", ".join(f"{b}: {ms:.0f}" for b, ms in by_batch.items())
        lines.append(f"engine decode step, ms by batch size (requests still running): {shown}")
        lines.append(f"transformers: {r['hf_ms_per_step']:.0f} ms per step (its prefill spread over them), always at batch {r['num_prompts']}")
    for m in r["mismatches"]:
        lines.append(f"  request {m['request']}: first difference at token {m['position']}, top-2 logit margin {m['top2_logit_margin']:.4g}")
    if "fp32_agreement" in r:
        lines.append(precision.format_agreement(r["fp32_agreement"], r["dtype"]))
    lines.append(roofline.format_report(r["roofline"]))
    shares = r["roofline"]["mean_share_by_run"]
    if len(shares) > 1 and None not in shares:
        each = ", ".join(f"{100 * x:.0f}%" for x in shares)
        tight = r["roofline"].get("mean_tight_share_by_run", [None])
        tighter = "; of the tighter roofline: " + ", ".join(f"{100 * x:.0f}%" for x in tight) if None not in tight else ""
        lines.append(f"  (the steps above: engine run {r['roofline']['run'] + 1} of {len(shares)}, the fastest; mean share in each run: {each}{tighter})")
    if r.get("prefill"):
        lines.append(roofline.format_prefill(r["prefill"], r["roofline"]["peaks"]))
    samples = r["roofline"].get("peak_samples", [])
    if len(samples) > 1:
        copy, mm = [s["bandwidth_gb_s"] for s in samples], [s["matmul_gflop_s"] for s in samples]
        lines.append(f"  (the machine measured {len(samples)} times, at the start, after each engine run and at the end: copy "
                     f"{min(copy):.1f}-{max(copy):.1f} GB/s, torch.mm {min(mm):.0f}-{max(mm):.0f} GFLOP/s; the roofline takes the best of each)")
    if "vllm_tokens_per_s" in r:
        from engine.vllm_bridge.compare import format_vllm_column

        lines += format_vllm_column(r, r["block_size"])
    return "\n".join(lines)


def _best(a: roofline.MachinePeaks, b: roofline.MachinePeaks) -> roofline.MachinePeaks:
    """The higher of each figure of two measurements of the same machine."""
    def higher(x: float | None, y: float | None) -> float | None:
        return None if x is None and y is None else max(v for v in (x, y) if v is not None)

    return roofline.MachinePeaks(max(a.bandwidth_gb_s, b.bandwidth_gb_s), max(a.matmul_gflop_s, b.matmul_gflop_s), a.threads,
                                 higher(a.read_gb_s, b.read_gb_s), higher(a.onednn_gflop_s, b.onednn_gflop_s), a.dtype)
