"""The simulator's prediction of an online trace, beside what a server measured on it.

``python -m engine bench-serve --predict`` sends a trace to the lab's server and then runs the
same trace through the simulator (engine/sim/simulator.py: the engine's own scheduler and block
manager, no model) with the server's KV pool and limits and the step-time model fitted on this
machine (``python -m engine calibrate``, engine/sim/cost_model.py). Each request arrives in the
simulation when the client sent it, so the two see the same arrivals.

Per request the simulation gives TTFT (arrival -> the end of the step that prefilled it), TPOT
((finish - first token) / (output tokens - 1)) and end-to-end latency. The comparison
(:func:`compare_prediction`) is LLMServingSim's validation: the relative error of the mean and of
the 90th percentile of TTFT and TPOT, predicted against measured.

What the simulation leaves out, and the measurement includes: the HTTP request and the streamed
response, tokenizing the prompt in the server, handing each step's text to the event loop; and
the client itself, which on a small machine shares the cores with the server.
"""

from __future__ import annotations

import math

import numpy as np

from engine.sim.cost_model import PS_PER_S, THIS_MACHINE, CostModel
from engine.sim.workloads import Request

PREDICTED = ("ttft", "tpot", "e2el")


def predict_trace(arrivals: list[float], prompt_lens: list[int], output_lens: list[int], block_size: int, num_blocks: int,
                  max_num_seqs: int, max_model_len: int, max_num_batched_tokens: int,
                  cost_model: str | CostModel = THIS_MACHINE, schedule_first: str = "decodes") -> dict:
    """Simulate the trace on the engine's scheduler with ``cost_model``'s step times.

    Args:
        arrivals: when each request was sent, s (any order; results come back in this order).
        prompt_lens, output_lens: tokens per request.
        block_size, num_blocks: the server's KV pool.
        max_num_seqs, max_model_len, max_num_batched_tokens: the server's limits (``serve``'s flags).
        cost_model: a preset key of engine.sim.cost_model (default: this machine's fit) or a CostModel.
        schedule_first: the server's scheduler rule ("decodes", the engine's default).

    Returns:
        {"ttft_s", "tpot_s", "e2el_s": per request, in seconds (NaN: not completed; TPOT NaN for a
        one-token output), "duration_s" (the simulated clock at the end), "steps", "preemptions",
        "cost_model" (its name)}.

    Raises:
        ValueError: lists of different lengths, or what :class:`~engine.sim.simulator.SimulationConfig`
            refuses (e.g. "this-machine" before ``python -m engine calibrate`` ran).
    """
    from engine.sim.simulator import SimulationConfig, _Run

    if not len(arrivals) == len(prompt_lens) == len(output_lens) or not arrivals:
        raise ValueError(f"one arrival, prompt length and output length per request; got {len(arrivals)}, {len(prompt_lens)}, {len(output_lens)}")
    order = np.argsort(np.asarray(arrivals, dtype=np.float64), kind="stable")
    t0 = min(arrivals)
    requests = [Request(float(arrivals[i] - t0), int(prompt_lens[i]), int(output_lens[i])) for i in order]
    cfg = SimulationConfig(requests=requests, kv_slots=num_blocks * block_size, block_size=block_size, max_num_seqs=max_num_seqs,
                           max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens, cost_model=cost_model,
                           schedule_first=schedule_first)
    run = _Run(cfg, requests)
    run.run()
    clock = run.clock
    arrival = np.array(clock.arrival, dtype=np.int64)
    done = clock.finish >= 0
    ttft = np.where(done, (clock.first_token - arrival) / PS_PER_S, np.nan)
    e2el = np.where(done, (clock.finish - arrival) / PS_PER_S, np.nan)
    out_len = clock.output_len
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(done & (out_len > 1), (clock.finish - clock.first_token) / PS_PER_S / np.maximum(out_len - 1, 1), np.nan)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))  # sorted position of each request
    return {"ttft_s": ttft[back].tolist(), "tpot_s": tpot[back].tolist(), "e2el_s": e2el[back].tolist(),
            "duration_s": clock.seconds, "steps": run.step, "preemptions": run.preemptions, "cost_model": clock.model.name}


def compare_prediction(prediction: dict, measured: dict[str, list[float]]) -> dict:
    """Predicted against measured, per metric (``ttft``, ``tpot``, ``e2el``), over the requests
    both completed: {"mean": {"measured_ms", "predicted_ms", "error"}, "p90": {...}} with error =
    predicted / measured - 1, plus "requests" compared.

    Args:
        prediction: :func:`predict_trace`'s result.
        measured: "ttft", "tpot", "e2el" -> per request, s (NaN or None: failed), in the same order.
    """
    out: dict = {"cost_model": prediction["cost_model"], "predicted_duration_s": prediction["duration_s"],
                 "predicted_steps": prediction["steps"], "predicted_preemptions": prediction["preemptions"]}
    for name in PREDICTED:
        predicted = np.array(prediction[f"{name}_s"], dtype=np.float64)
        real = np.array([math.nan if v is None else v for v in measured[name]], dtype=np.float64)
        both = ~np.isnan(predicted) & ~np.isnan(real)
        if not both.any():
            continue
        p, m = predicted[both] * 1e3, real[both] * 1e3
        out[name] = {"requests": int(both.sum())}
        for stat, f in (("mean", np.mean), ("p50", np.median), ("p90", lambda x: np.percentile(x, 90))):
            mv, pv = float(f(m)), float(f(p))
            out[name][stat] = {"measured_ms": mv, "predicted_ms": pv, "error": pv / mv - 1 if mv else math.nan}
    return out


def format_prediction(c: dict) -> str:
    """The comparison as a table: per metric, measured and predicted mean, p50 and p90 (ms) and the errors."""
    lines = [f"{' Simulator prediction (' + c['cost_model'] + ') ':=^78}",
             f"{'metric':<8}{'':>4}{'mean ms':>12}{'p50 ms':>12}{'p90 ms':>12}    error: {'mean':>7}{'p90':>8}"]
    for name in PREDICTED:
        if name not in c:
            continue
        e = c[name]
        lines.append(f"{name.upper():<8}{'real':>4}{e['mean']['measured_ms']:>12.1f}{e['p50']['measured_ms']:>12.1f}{e['p90']['measured_ms']:>12.1f}")
        lines.append(f"{'':<8}{'sim':>4}{e['mean']['predicted_ms']:>12.1f}{e['p50']['predicted_ms']:>12.1f}{e['p90']['predicted_ms']:>12.1f}"
                     f"    {'':>7}{e['mean']['error']:>+7.1%}{e['p90']['error']:>+8.1%}")
    lines.append(f"simulated: {c['predicted_steps']} steps, {c['predicted_preemptions']} preemptions, {c['predicted_duration_s']:.1f} s")
    lines.append("=" * 78)
    return "\n".join(lines)
