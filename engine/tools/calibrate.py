"""``python -m engine calibrate``: fit the step-time model (engine/sim/cost_model.py) to this machine.

It runs the real engine (the default model, paged KV) on a grid of batch shapes — B requests of
P prompt tokens each, a few decode steps — records every step's shape and wall time, and fits the
additive form of the cost model (``roofline=False``: on a CPU compute and memory traffic do not
overlap) by non-negative least squares. The weights' read is a constant per step,
so the fit cannot tell it from the fixed overhead: ``step_overhead_s`` holds both, ``weights_s`` is 0.

Validation, in the same run: the calibrated model predicts the engine's wall time on two workloads
it was not fitted on — the bench's "mixed" workload (engine/tools/bench.py) and the app's preemption
preset (eight 96-token stories in a 40-block pool) — per step and in total. The same fit and check
are also made on the process's CPU time per step: on a machine shared with other processes, wall
time includes the time they held the cores, CPU time does not.

The fit is kept in the user cache (``engine.sim.cost_model.calibration_path()``), where the
"this-machine" preset reads it.
"""

from __future__ import annotations

import dataclasses

import json
import platform
import time

import numpy as np

from engine.sim.cost_model import CostModel, StepShape, THIS_MACHINE, calibration_path

# (block size, batch sizes, prompt lengths): a second block size tells the per-block cost apart
# from the per-token one (at one block size, blocks = context / block_size almost exactly).
GRID = ((16, (1, 2, 4, 8, 16), (16, 64, 192)), (4, (1, 4, 16), (64, 192)))
GRID_DECODE_STEPS = 6
FEATURES = ("step", "seqs", "tokens", "pairs", "kv_tokens", "blocks")
# The app's "preemption" preset (app_pages/state.py): more tokens than the pool holds together.
PREEMPTION_TOPICS = ("a lighthouse", "a cat", "the moon", "a train", "a forest", "a robot", "the sea", "a city")
PREEMPTION_BLOCKS, PREEMPTION_TOKENS = 40, 96


def features(shape: StepShape) -> list[float]:
    """The fit's columns for one step, in ``FEATURES`` order (units as in :class:`StepShape`)."""
    return [1.0, shape.num_prefills + shape.num_decodes, shape.num_tokens, shape.prefill_pairs + shape.decode_context,
            shape.decode_context, shape.kv_blocks]


def fit_cost_model(shapes: list[StepShape], seconds: list[float], name: str = "this machine (fitted)") -> CostModel:
    """Non-negative least squares of step times (s) on :func:`features`. Unweighted, so that long
    steps count by their seconds: what the simulator sums is time, and the fitted total then
    matches the measured one. Returns the additive CostModel.

    Raises:
        ValueError: fewer steps than coefficients, or a time <= 0.
    """
    from scipy.optimize import nnls

    if len(shapes) != len(seconds) or len(shapes) < len(FEATURES):
        raise ValueError(f"need at least {len(FEATURES)} measured steps (one time each), got {len(shapes)}")
    y = np.asarray(seconds, dtype=np.float64)
    if not np.all(y > 0):
        raise ValueError("step times must be > 0 s")
    x = np.array([features(s) for s in shapes])
    coef, _ = nnls(x, y)
    c = dict(zip(FEATURES, coef.tolist()))
    return CostModel(name, step_overhead_s=c["step"], weights_s=0.0, token_s=c["tokens"], pair_s=c["pairs"],
                     kv_token_s=c["kv_tokens"], block_s=c["blocks"], seq_overhead_s=c["seqs"], roofline=False)


def prediction_error(model: CostModel, shapes: list[StepShape], seconds: list[float]) -> dict:
    """Predicted against measured: total seconds of each, their relative error, and the per-step
    relative error (mean of |error|, median, 90th percentile, worst)."""
    predicted = np.array([model.step_time(s) for s in shapes])
    measured = np.asarray(seconds)
    rel = np.abs(predicted - measured) / measured
    return {
        "steps": len(shapes), "measured_s": float(measured.sum()), "predicted_s": float(predicted.sum()),
        "total_error": float(predicted.sum() / measured.sum() - 1),
        "step_error_mean": float(rel.mean()), "step_error_median": float(np.median(rel)),
        "step_error_p90": float(np.quantile(rel, 0.9)), "step_error_max": float(rel.max()),
    }


def shape_of_report(report, block_size: int | None) -> StepShape:
    """A real engine step's :class:`StepShape`, from its StepReport's scheduled requests.

    A speculative verification (a decode of 1 + k query tokens) is prefill-shaped work over its
    cached context, as :func:`~engine.sim.cost_model.speculative_step_shape` models it."""
    verifying = [r for r in report.scheduled if r.phase == "decode" and r.num_tokens > 1]
    prefills = [(r.num_tokens, r.context_len) for r in report.scheduled if r.phase == "prefill" or r in verifying]
    decodes = [r.context_len for r in report.scheduled if r.phase == "decode" and r not in verifying]
    shape = StepShape.of_batch(prefills, decodes, block_size)
    if not verifying:
        return shape
    return dataclasses.replace(shape, cached_context=sum(r.context_len - r.num_tokens for r in verifying))


def run_engine(engine, prompts: list, max_tokens: list[int]) -> tuple[list[StepShape], list[float], float, list[float]]:
    """Serve ``prompts`` (greedy, ignore_eos) to the end: every non-idle step's shape and wall time
    (s), the wall time of the whole loop (s), and every step's CPU time of this process (s; on a
    shared machine it leaves out the time others held the cores)."""
    from engine.sampling_params import SamplingParams

    for prompt, n in zip(prompts, max_tokens):
        engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
    block_size = engine.config.block_size if engine.config.allocator == "paged" else None
    shapes, seconds, cpu = [], [], []
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        cpu_start = time.process_time()
        report = engine.step()
        if report.scheduled:
            cpu.append(time.process_time() - cpu_start)
            shapes.append(shape_of_report(report, block_size))
            seconds.append(report.timings_ms["total"] / 1e3)
    return shapes, seconds, time.perf_counter() - start, cpu


def calibrate(model: str | None = None, validate: bool = True, save: bool = True, threads: int | None = None,
              progress=print) -> dict:
    """Measure the grid, fit, validate, save. Returns the figures (see :func:`format_calibration`).

    ``threads``: torch CPU threads (default: half the cores, at least 1 — OpenMP threads spin when
    a core is taken, which on a shared machine makes step times erratic)."""
    import os

    import torch

    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.tools.bench import mixed_workload

    torch.set_num_threads(threads or max(1, (os.cpu_count() or 2) // 2))

    rng = np.random.default_rng(0)
    shapes, seconds, cpu = [], [], []
    for block_size, batches, prompt_lens in GRID:
        engine = LLMEngine(EngineConfig(model=model, block_size=block_size, max_num_seqs=max(batches)))
        vocab = engine.hf_config.vocab_size
        run_engine(engine, [rng.integers(0, vocab, 32).tolist()] * 4, [4] * 4)  # warm-up: fresh pages, first kernels
        for batch in batches:
            for prompt_len in prompt_lens:
                progress(f"grid: block size {block_size}, {batch} requests x {prompt_len} prompt tokens")
                prompts = [rng.integers(0, vocab, prompt_len).tolist() for _ in range(batch)]
                s, t, _, c = run_engine(engine, prompts, [GRID_DECODE_STEPS + 1] * batch)
                shapes += s
                seconds += t
                cpu += c
    engine = LLMEngine(EngineConfig(model=model))
    fitted = fit_cost_model(shapes, seconds)
    fitted_cpu = fit_cost_model(shapes, cpu, name="this machine (fitted on CPU time)")
    result = {"cost_model": fitted.to_json(), "fit": prediction_error(fitted, shapes, seconds),
              "cpu_time": {"cost_model": fitted_cpu.to_json(), "fit": prediction_error(fitted_cpu, shapes, cpu), "validation": {}},
              "kv_slots": engine.num_blocks * engine.config.block_size, "max_model_len": engine.max_model_len,
              "description": f"{engine.model_name} on this machine ({platform.machine()}, {engine.cpu_backend}), fitted",
              "machine": {"platform": platform.platform(), "torch_threads": _torch_threads()}}
    if validate:
        result["validation"] = {}
        prompts, lengths = mixed_workload(16, 8, 128)
        progress("validation: the bench's mixed workload")
        runs = {"mixed": run_engine(engine, prompts, lengths)}
        progress("validation: the app's preemption preset")
        small = LLMEngine(EngineConfig(model=model, num_gpu_blocks=PREEMPTION_BLOCKS))
        stories = [f"Write a story about {topic}." for topic in PREEMPTION_TOPICS]
        runs["preemption"] = run_engine(small, stories, [PREEMPTION_TOKENS] * len(stories))
        for name, (s, wall, loop_s, cpu_s) in runs.items():
            result["validation"][name] = _validate(fitted, s, wall, loop_s)
            result["cpu_time"]["validation"][name] = prediction_error(fitted_cpu, s, cpu_s)
    if save:
        save_calibration(result)
    return result


def save_calibration(result: dict) -> None:
    """Keep a fit where the "this-machine" preset reads it (``calibration_path()``); sets ``result["saved_to"]``."""
    path = calibration_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    result["saved_to"] = str(path)


def _validate(model: CostModel, shapes: list[StepShape], seconds: list[float], loop_s: float) -> dict:
    figures = prediction_error(model, shapes, seconds)
    figures["loop_wall_s"] = loop_s
    figures["wall_error"] = figures["predicted_s"] / loop_s - 1
    return figures


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def format_calibration(r: dict) -> str:
    c = r["cost_model"]
    lines = [
        f"fitted ({THIS_MACHINE}): step {1e3 * c['step_overhead_s']:.2f} ms + {1e3 * c['seq_overhead_s']:.3f} ms/sequence "
        f"+ {1e3 * c['token_s']:.3f} ms/token + {1e9 * c['pair_s']:.1f} ns/attention pair "
        f"+ {1e9 * c['kv_token_s']:.1f} ns/KV token + {1e6 * c['block_s']:.2f} us/KV block",
        _error_line("fit (server steps)" if "server" in r else "fit (grid)", r["fit"]),
    ]
    for name, v in r.get("validation", {}).items():
        lines.append(_error_line(f"validation: {name}", v) + f"; loop wall {v['loop_wall_s']:.2f} s ({v['wall_error']:+.1%})")
    cpu = r.get("cpu_time")
    if cpu:
        lines.append("the same, fitted and checked on this process's CPU time (robust to other processes on the cores):")
        lines += [_error_line("  fit (grid)", cpu["fit"])] + [_error_line(f"  validation: {n}", v) for n, v in cpu["validation"].items()]
    if "saved_to" in r:
        lines.append(f"saved to {r['saved_to']}")
    return "\n".join(lines)


def _error_line(label: str, e: dict) -> str:
    return (f"{label}: {e['steps']} steps, measured {e['measured_s']:.2f} s, predicted {e['predicted_s']:.2f} s "
            f"({e['total_error']:+.1%}); per-step |error| mean {e['step_error_mean']:.1%}, median "
            f"{e['step_error_median']:.1%}, p90 {e['step_error_p90']:.1%}, max {e['step_error_max']:.1%}")
