"""``python -m engine bench --speculative ngram|draft_layers``: when speculative decoding pays, measured
and predicted, side by side.

For each workload and batch size B, the same B greedy requests are served to the end by the engine
without speculation and with it (same pool, same everything else), and the outputs are checked
identical. Reported per row: output tokens/s of both, the speed-up, the acceptance rate (accepted /
proposed drafts) and the mean accepted length (tokens per verification, the bonus included), and
the step-time model's predicted speed-up for the measured acceptance rate
(``engine/sim/speculative.py``). Two workloads:

- ``copy``: requests that repeat or lightly edit a text given in the prompt (summaries, edits,
  quotations): prompt lookup finds long matches.
- ``open``: open-ended questions: lookup rarely finds anything (the early-exit draft may).

The prediction uses this machine's step-time model when ``python -m engine calibrate`` has fitted
one; otherwise it fits one on the plain runs' own steps (said so in the output).
"""

from __future__ import annotations

import time

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.model_executor.model_loader import load_model
from engine.sampling_params import SamplingParams
from engine.sim.cost_model import CostModel, get_setup
from engine.sim.speculative import alpha_from_mean_accepted_length, predict_speedup
from engine.spec_decode.config import SpeculativeConfig

TEXTS = [
    "The library opens at nine in the morning and closes at five in the afternoon on weekdays; on Saturdays it closes at noon.",
    "To reset the router, hold the small button on the back for ten seconds, wait for the light to blink green, then reconnect.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen inside the chloroplasts of green plants.",
    "Our meeting moved from Tuesday at three to Thursday at ten, in the large room on the second floor next to the kitchen.",
]
COPY_TASKS = ["Repeat this text exactly: {t}", "Rewrite this text, changing only 'the' to 'THE': {t}", "Quote this sentence back to me: {t}"]
QUESTIONS = ["Tell me a short story about a dragon.", "What makes a good friend?", "Describe your ideal weekend.",
             "Why do people enjoy music?", "Give me three ideas for a birthday party.", "What is the best way to learn to cook?"]
WORKLOADS = ("copy", "open")


def workload_prompts(name: str, count: int) -> list[list[dict]]:
    """``count`` chat prompts of workload ``name`` ("copy" or "open")."""
    if name == "copy":
        texts = [COPY_TASKS[i % len(COPY_TASKS)].format(t=TEXTS[i % len(TEXTS)]) for i in range(count)]
    else:
        texts = [QUESTIONS[i % len(QUESTIONS)] for i in range(count)]
    return [[{"role": "user", "content": t}] for t in texts]


def _serve(engine: LLMEngine, prompts, max_tokens: int):
    ids = [engine.add_request(p, SamplingParams(max_tokens=max_tokens, ignore_eos=True)) for p in prompts]
    steps, shapes = 0, []
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        report = engine.step()
        steps += 1
        shapes.append(report)
    wall = time.perf_counter() - start
    outputs = [engine.take_output(i).token_ids for i in ids]
    return outputs, wall, steps, shapes


def run_spec_bench(method: str, model: str | None = None, batches: tuple[int, ...] = (1, 2, 4, 8, 16), k: int = 4,
                   num_draft_layers: int | None = None, max_tokens: int = 48, workloads: tuple[str, ...] = WORKLOADS,
                   block_size: int = 16, progress=None) -> dict:
    """Measure plain and speculative tokens/s at each batch size; see the module docstring.

    Raises:
        ValueError: a bad method, k, L or batch size (named).
    """
    if any(b < 1 for b in batches):
        raise ValueError(f"--batch-sizes must all be >= 1, got {list(batches)}")
    loaded = load_model(model)
    if method == "draft_layers" and num_draft_layers is None:
        num_draft_layers = max(1, loaded.config.num_hidden_layers // 2)
    spec = SpeculativeConfig(method, k, num_draft_layers=num_draft_layers if method == "draft_layers" else None)
    num_blocks = max(64, max(batches) * -(-(256 + max_tokens + k) // block_size))
    make = lambda s: LLMEngine(EngineConfig(model=model, block_size=block_size, num_gpu_blocks=num_blocks,  # noqa: E731
                                            max_num_seqs=max(batches), speculative_config=s), loaded_model=loaded)
    plain_engine, spec_engine = make(None), make(spec)
    for engine in (plain_engine, spec_engine):  # warm up: first-step costs (allocations, kernel first calls) are not measured
        _serve(engine, workload_prompts("copy", 1), 4)
    cost, cost_source = _cost_model()
    rows, fit_reports = [], []
    for workload in workloads:
        for batch in batches:
            prompts = workload_prompts(workload, batch)
            base, plain_s, plain_steps, reports = _serve(plain_engine, prompts, max_tokens)
            fit_reports += reports
            before = (spec_engine.spec.stats.proposed, spec_engine.spec.stats.accepted, spec_engine.spec.stats.verifications)
            ours, spec_s, spec_steps, _ = _serve(spec_engine, prompts, max_tokens)
            stats = spec_engine.spec.stats
            proposed, accepted, verifications = (stats.proposed - before[0], stats.accepted - before[1], stats.verifications - before[2])
            tokens = sum(len(o) for o in base)
            row = {
                "workload": workload, "batch": batch, "identical": ours == base,
                "plain_tokens_per_s": tokens / plain_s, "spec_tokens_per_s": tokens / spec_s,
                "speedup": plain_s / spec_s, "plain_steps": plain_steps, "spec_steps": spec_steps,
                "acceptance_rate": accepted / proposed if proposed else 0.0,
                "mean_accepted_length": (accepted + verifications) / verifications if verifications else 1.0,
                "proposed": proposed, "accepted": accepted,
            }
            rows.append(row)
            if progress:
                progress(f"{workload} batch {batch}: {row['speedup']:.2f}x, {row['plain_tokens_per_s']:.1f} -> "
                         f"{row['spec_tokens_per_s']:.1f} tokens/s, acceptance {row['acceptance_rate']:.2f}, "
                         f"mean accepted length {row['mean_accepted_length']:.2f}, identical {row['identical']}")
    if cost is None:
        cost, cost_source = _fit(fit_reports, block_size), "fitted on this run's plain steps"
    draft_cost = (num_draft_layers / loaded.config.num_hidden_layers) if method == "draft_layers" else 0.0
    for row in rows:
        context = 64 + max_tokens // 2  # a chat prompt here is ~50-90 tokens; half the output on average
        # The formula's α (per judged draft), from the measured tokens per verification; not
        # accepted / proposed, which counts the drafts after a rejection that nobody judged.
        alpha = min(alpha_from_mean_accepted_length(min(max(row["mean_accepted_length"], 1.0), k + 1), k), 0.999)
        row["alpha"] = alpha
        row["predicted_speedup"] = predict_speedup(cost, [row["batch"]], context, alpha, k, draft_cost, block_size)[0].speedup
    loses = {w: next((r["batch"] for r in rows if r["workload"] == w and r["speedup"] < 1), None) for w in workloads}
    return {"method": method, "k": k, "num_draft_layers": num_draft_layers, "model": plain_engine.model_name, "max_tokens": max_tokens,
            "rows": rows, "loses_from_batch": loses, "cost_model": cost_source}


def _cost_model() -> tuple[CostModel | None, str]:
    try:
        return get_setup("this-machine").cost_model, "this machine's calibration (python -m engine calibrate)"
    except ValueError:
        return None, ""


def _fit(reports, block_size: int) -> CostModel:
    from engine.tools.calibrate import fit_cost_model, shape_of_report

    steps = [r for r in reports if r.scheduled]
    return fit_cost_model([shape_of_report(r, block_size) for r in steps], [r.timings_ms["total"] / 1e3 for r in steps])


def format_spec_bench(result: dict) -> str:
    """The result as a table (one row per workload and batch size)."""
    lines = [f"speculative decoding: {result['method']}, k = {result['k']}"
             + (f", L = {result['num_draft_layers']} draft layers" if result["method"] == "draft_layers" else "")
             + f"; {result['model']}, {result['max_tokens']} tokens per request, greedy",
             f"{'workload':8} {'batch':>5} {'plain tok/s':>11} {'spec tok/s':>10} {'speed-up':>8} {'predicted':>9} "
             f"{'accept':>6} {'mean len':>8} {'same':>5}"]
    for r in result["rows"]:
        lines.append(f"{r['workload']:8} {r['batch']:>5} {r['plain_tokens_per_s']:>11.1f} {r['spec_tokens_per_s']:>10.1f} "
                     f"{r['speedup']:>7.2f}x {r['predicted_speedup']:>8.2f}x {r['acceptance_rate']:>6.2f} "
                     f"{r['mean_accepted_length']:>8.2f} {'yes' if r['identical'] else 'NO':>5}")
    for workload, batch in result["loses_from_batch"].items():
        lines.append(f"{workload}: " + (f"speculation loses from batch {batch} on" if batch else "speculation never lost in these batches"))
    lines.append(f"prediction: step-time model {result['cost_model']}")
    return "\n".join(lines)
