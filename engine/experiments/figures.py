"""The PagedAttention paper's §6-§7 experiments on the simulator, each beside the paper's numbers.

Kwon et al., SOSP 2023. Set-up (§6.1): OPT-13B on one A100-40GB, 15.7K KV token slots (Table 1),
max length 2048, block size 16, Poisson arrivals; vLLM (paged, vLLM's 1% admission watermark)
against Orca Max / Pow2 / Oracle (contiguous, buddy placement: ``engine.experiments.paper_data.PAPER_SYSTEMS``).
Time comes from the step-time model preset ``a100-opt-13b-achieved`` (engine/sim/cost_model.py).

- Figure 2: the KV memory breakdown on ShareGPT at one stated request rate (an operating point
  like §6.2's, not saturation), averaged over the steps of the run.
- Figure 12: normalized latency (s/token) against request rate on ShareGPT and Alpaca, the four
  systems and the FasterTransformer baseline (``FIGURE_12_SYSTEMS``: static batching,
  engine/baselines/static_batching.py, with Orca (Max)'s memory: the one difference from Orca (Max) is
  request-level scheduling); each
  system's *sustainable rate* is where its normalized latency crosses ``THRESHOLD`` x its value at
  the lowest rate of the sweep (linearly interpolated between the two sweep rates around the
  crossing; a system that never crosses is reported as ">= the highest rate").
- Figure 13: mean batched requests (requests running per step) at ShareGPT 2 req/s and Alpaca 30 req/s.
- Figure 15: memory saved by sharing (§6.3) for parallel sampling and beam search, no time needed.
- Figure 16: a shared prefix (prefix caching): batch size, memory and throughput (``engine.experiments.figures.reproduce_figure16``).
- Figure 18b: vLLM's normalized latency against block size.

Every function returns plain rows (dicts); ``format_figure`` prints them, ``visualize/paper.py``
draws them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from tqdm import tqdm

from engine.sim.cost_model import StepShape, get_setup, prefill_pairs
from engine.experiments.paper_data import PAPER_CONCURRENCY, PAPER_FIGURES, PAPER_FRAGMENTATION, PAPER_SCHEDULER, PAPER_SYSTEMS, PAPER_TOKEN_STATES
from engine.sim.simulator import simulate
from engine.sim.workloads import make_workload
from engine.experiments.paper_data import PAPER_PREFIX_SPEEDUP

SETUP = "a100-opt-13b-achieved"
KV_SLOTS, MAX_MODEL_LEN, BLOCK_SIZE = 15_700, 2048, 16
THRESHOLD = 2.0
FIGURES = PAPER_FIGURES
SWEEP_RATES = {
    "sharegpt": (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5),
    "alpaca": (5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
}
FIGURE_2_RATE = 1.0  # ShareGPT req/s: every Orca is loaded (requests queue), none has run away yet
FIGURE_13_RATES = {"sharegpt": 2.0, "alpaca": 30.0}  # the caption's rates
FIGURE_18_RATES = {"sharegpt": 1.5, "alpaca": 40.0}  # near vLLM's sustainable rate, where memory matters
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
STATIC = "FasterTransformer"
# Figure 12's systems: the paper's four, and static batching as FasterTransformer (its KV memory as
# Orca (Max)'s: a max-length reservation per request; FasterTransformer preallocates its batch's).
FIGURE_12_SYSTEMS = {**PAPER_SYSTEMS, STATIC: dict(allocator="contiguous", reservation="max", placement="buddy", policy="static")}
# FasterTransformer saturates below the sweep's lowest rates (a batch of 7 runs as long as its longest
# request: ShareGPT at 0.25 req/s is already past it), so in the default sweep its rates start lower
# and its sustainable rate is a crossing, not the lowest rate of the sweep.
STATIC_LOW_RATES = {"sharegpt": (0.05, 0.1, 0.15), "alpaca": (0.5, 1.0, 2.5)}
# Paper, §6.2 and Figure 12 (ShareGPT, OPT-13B/66B/175B): vLLM's sustainable rate over each baseline's,
# (low, high); (None, high) = "up to" (FasterTransformer: up to 22x, §6.2).
PAPER_RATE_RATIOS = {"sharegpt": {"Orca (Oracle)": (1.7, 2.7), "Orca (Max)": (2.7, 8.0), STATIC: (None, 22.0)}}
PAPER_BEST_BLOCK_SIZES = {"sharegpt": (16, 128), "alpaca": (16, 32)}  # §7.2, Figure 18b


def _check_rates(rates) -> tuple[float, ...]:
    rates = tuple(rates)
    if not rates:
        raise ValueError("empty sweep: give at least one request rate")
    for r in rates:
        if not (r > 0 and math.isfinite(r)):
            raise ValueError(f"request rates must be finite and > 0 requests/s, got {r}")
    return tuple(sorted(rates))


def _run(workload: str, rate: float, system: str, num_requests: int, seed: int, block_size: int = BLOCK_SIZE,
         setup: str = SETUP, kv_slots: int | None = KV_SLOTS, max_model_len: int | None = MAX_MODEL_LEN):
    """One simulation of the sweep; ``kv_slots`` / ``max_model_len`` None = the preset's own (its
    ``engine.sim.cost_model.Setup``), else the paper's pool whatever the preset times it with."""
    if kv_slots is None or max_model_len is None:
        preset = get_setup(setup)
        kv_slots = preset.kv_slots if kv_slots is None else kv_slots
        max_model_len = preset.max_model_len if max_model_len is None else max_model_len
    requests = make_workload(workload, num_requests, seed, max_model_len, rate)
    overrides = dict(FIGURE_12_SYSTEMS[system])
    if "max_num_batched_tokens" in overrides:  # the paper's 2,560 is 512 above its longest request: so for longer ones
        overrides["max_num_batched_tokens"] = max(overrides["max_num_batched_tokens"], max_model_len + 512)
    return simulate(requests=requests, kv_slots=kv_slots, block_size=block_size, max_model_len=max_model_len,
                    cost_model=setup, **overrides)


def _latency_row(workload: str, system: str, rate: float, res) -> dict:
    return {
        "workload": workload, "system": system, "request_rate": rate,
        "normalized_latency_s": res.normalized_latency_s, "mean_latency_s": res.mean_latency_s,
        "mean_ttft_s": res.mean_ttft_s, "mean_tpot_s": res.mean_tpot_s,
        "throughput_requests_per_s": res.throughput_requests_per_s, "throughput_tokens_per_s": res.throughput_tokens_per_s,
        "mean_batched_requests": res.mean_concurrent_requests, "preemptions": res.preemptions,
    }


def paper_ratio_text(paper: tuple | None) -> str:
    """The paper's ratio range as printed: "1.7-2.7x", "up to 22x", or "-" (none given)."""
    if not paper:
        return "-"
    return f"up to {paper[1]:g}x" if paper[0] is None else f"{paper[0]:g}-{paper[1]:g}x"


def latency_sweep(workloads=("sharegpt", "alpaca"), rates: dict | None = None, systems=tuple(FIGURE_12_SYSTEMS),
                  num_requests: int = 1000, seed: int = 0, setup: str = SETUP, progress: bool = False,
                  kv_slots: int | None = KV_SLOTS, max_model_len: int | None = MAX_MODEL_LEN) -> list[dict]:
    """Every (workload, system, rate) of the sweep: one simulation each, the same requests for
    every system at a rate. Rows as :func:`_latency_row`. ``rates`` None = :func:`sweep_rates` of
    ``setup`` (``SWEEP_RATES`` for the paper's), FasterTransformer's starting lower. ``kv_slots`` and
    ``max_model_len`` (slots, tokens): the pool of every run; None = the preset's own.

    Raises:
        ValueError: an empty sweep, a rate <= 0, an unknown system or preset.
    """
    if rates is None:
        rates, low = {}, {}
        for w in workloads:
            rates[w], low[w] = sweep_rates(w, setup)
    else:
        low = {}
    plan = [(w, _check_rates(rates[w] + (low.get(w, ()) if s == STATIC else ())), s) for w in workloads for s in systems]
    for _, _, s in plan:
        if s not in FIGURE_12_SYSTEMS:
            raise ValueError(f"unknown system {s!r}; choose from {', '.join(FIGURE_12_SYSTEMS)}")
    if not plan:
        raise ValueError("empty sweep: give at least one workload and one system")
    rows = []
    with tqdm(total=sum(len(r) for _, r, _ in plan), disable=not progress, unit="run", desc="sweep") as bar:
        for workload, wrates, system in plan:
            for rate in wrates:
                res = _run(workload, rate, system, num_requests, seed, setup=setup, kv_slots=kv_slots, max_model_len=max_model_len)
                rows.append(_latency_row(workload, system, rate, res))
                bar.update(1)
    return rows


class Capacity(NamedTuple):
    """:func:`vllm_capacity`'s estimate: ``rate`` (req/s) and the ``batch`` (running requests) it assumes."""

    rate: float
    batch: int


def vllm_capacity(workload: str, setup: str = SETUP, seed: int = 0, block_size: int = BLOCK_SIZE,
                  max_num_seqs: int = 256) -> Capacity:
    """A quick estimate, without simulating, of the request rate vLLM can serve under the preset
    ``setup`` (its cost model and its pool) on ``workload``: Little's law with the memory bound.

    Running requests hold prompt + half their output on average (P + O/2 tokens, the workload's
    means), so the pool runs B = min(max_num_seqs, kv_slots / (P + O/2)) of them; a request costs its
    share of O decode steps of batch B at that context, plus its prefill's compute (P tokens through
    the linear layers and their causal attention pairs; the weights are read by the step anyway, as
    prefills are batched with decodes). Capacity = 1 / that time.

    Raises:
        ValueError: an unknown preset or workload.
    """
    preset = get_setup(setup)
    requests = make_workload(workload, 1000, seed, preset.max_model_len)
    prompt = sum(r.prompt_len for r in requests) / len(requests)
    output = sum(r.output_len for r in requests) / len(requests)
    context = round(prompt + output / 2)
    batch = max(1, min(max_num_seqs, int(preset.kv_slots // context)))
    cm, p = preset.cost_model, round(prompt)
    step_s = cm.step_time(StepShape.of_batch([], [context] * batch, block_size))
    return Capacity(1.0 / (output * step_s / batch + p * cm.token_s + prefill_pairs(p, p) * cm.pair_s), batch)


def steady_requests(workload: str, setup: str = SETUP, base: int = 500) -> int:
    """Requests per sweep point under ``setup``: ``base`` for the paper's preset; another one needs a
    Poisson trace many times longer than its batch in flight before queues (and the knee) show, so
    at least 8x :func:`vllm_capacity`'s batch, rounded up to a multiple of 500 (the H100 preset runs
    256 requests at once: 2,500)."""
    if setup == SETUP:
        return base
    return max(base, -(-8 * vllm_capacity(workload, setup).batch // 500) * 500)


def _two_digits(x: float) -> float:
    return float(f"{x:.2g}")


def sweep_rates(workload: str, setup: str = SETUP) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(rates, FasterTransformer's extra low rates) of the sweep under ``setup``, req/s.

    The paper's preset gets ``SWEEP_RATES`` and ``STATIC_LOW_RATES`` as they are. Another preset
    serves a different load (an H100 with Llama-3-8B sustains several times the A100's rate, this
    CPU a small fraction of it), so its rates are the same list scaled by the ratio of
    :func:`vllm_capacity` under it to that under the paper's preset, to two significant digits: the
    sweep then spans the same range around vLLM's knee, whatever the hardware.
    """
    if setup == SETUP:
        return SWEEP_RATES[workload], STATIC_LOW_RATES[workload]
    scale = vllm_capacity(workload, setup).rate / vllm_capacity(workload, SETUP).rate
    return (tuple(_two_digits(r * scale) for r in SWEEP_RATES[workload]),
            tuple(_two_digits(r * scale) for r in STATIC_LOW_RATES[workload]))


def sustainable_rate(rates: list[float], latencies: list[float], threshold: float = THRESHOLD) -> tuple[float, bool]:
    """(rate, reached): where normalized latency first crosses ``threshold`` x its lowest-rate value,
    interpolated linearly between the sweep rates around it; (highest rate, False) if it never does."""
    limit = threshold * latencies[0]
    for i in range(1, len(rates)):
        if latencies[i] >= limit:
            r0, r1, l0, l1 = rates[i - 1], rates[i], latencies[i - 1], latencies[i]
            return r0 + (r1 - r0) * (limit - l0) / (l1 - l0), True
    return rates[-1], False


def sustainable_rates(rows: list[dict]) -> dict[str, tuple[float, bool]]:
    """{system: :func:`sustainable_rate`} for the rows of one workload, systems in their order there."""
    found = {}
    for system in dict.fromkeys(r["system"] for r in rows):
        mine = [r for r in rows if r["system"] == system]
        found[system] = sustainable_rate([r["request_rate"] for r in mine], [r["normalized_latency_s"] for r in mine])
    return found


def rate_table(rows: list[dict]) -> list[dict]:
    """One workload's sweep as Figure 12's summary: per system its sustainable ``rate`` (req/s),
    ``reached`` (False: a lower bound), vLLM's ``ratio`` over it (None for vLLM itself), the paper's
    (``paper``: (low, high), (None, high) = "up to", None = the paper gives none), and
    ``loaded_at_lowest``: already at ``THRESHOLD`` x vLLM's low-load latency at its lowest rate, so it
    saturates below the sweep and its crossing is no sustainable rate (its rate is then "< lowest rate").
    """
    workload = rows[0]["workload"]
    found = sustainable_rates(rows)
    vllm_rate = found["vLLM"][0]
    first = {}
    for r in rows:  # each system's point at its lowest rate (rows are in rate order per system)
        first.setdefault(r["system"], r)
    low_load = first["vLLM"]["normalized_latency_s"]
    table = []
    for system, (rate, reached) in found.items():
        loaded = system != "vLLM" and first[system]["normalized_latency_s"] >= THRESHOLD * low_load
        if loaded:
            rate, reached = first[system]["request_rate"], True
        table.append({"system": system, "rate": rate, "reached": reached, "loaded_at_lowest": loaded,
                      "ratio": None if system == "vLLM" else vllm_rate / rate, "paper": PAPER_RATE_RATIOS.get(workload, {}).get(system)})
    return table


def paper_rate_marks(workload: str, vllm_rate: float) -> list[dict]:
    """Where the paper's Figure 12 ratios put each baseline, given vLLM's sustainable rate here:
    {system, low_rate, high_rate, paper}: the baseline's rate = vLLM's / the paper's ratio, so the
    band runs from ``vllm_rate / high`` to ``vllm_rate / low`` (req/s); "up to 22x" has no upper end
    (``high_rate`` None). Empty where the paper gives no ratio (Alpaca)."""
    return [{"system": system, "low_rate": vllm_rate / hi, "high_rate": None if lo is None else vllm_rate / lo, "paper": (lo, hi)}
            for system, (lo, hi) in PAPER_RATE_RATIOS.get(workload, {}).items()]


def figure_12(num_requests: int = 1000, seed: int = 0, rates: dict | None = None, progress: bool = False,
              setup: str = SETUP, systems=tuple(FIGURE_12_SYSTEMS)) -> dict:
    """Normalized latency against rate, sustainable rates and vLLM's ratios over each baseline
    (``systems``: keys of ``FIGURE_12_SYSTEMS``, vLLM among them).

    Returns:
        {"rows": sweep rows, "sustainable": [{workload, system, rate, reached}],
         "ratios": [{workload, baseline, ratio, at_least (bool: a rate was a lower bound), paper (lo, hi) or None}],
         "threshold": THRESHOLD, "setup": setup}
    """
    rows = latency_sweep(rates=rates, systems=systems, num_requests=num_requests, seed=seed, progress=progress, setup=setup)
    sustainable, ratios = [], []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        found = sustainable_rates([r for r in rows if r["workload"] == workload])
        sustainable += [{"workload": workload, "system": system, "rate": rate, "reached": reached}
                        for system, (rate, reached) in found.items()]
        vllm_rate, vllm_reached = found["vLLM"]
        for baseline in [s for s in ("Orca (Oracle)", "Orca (Pow2)", "Orca (Max)", STATIC) if s in found]:
            rate, reached = found[baseline]
            ratios.append({"workload": workload, "baseline": baseline, "ratio": vllm_rate / rate,
                           "at_least": not vllm_reached, "paper": PAPER_RATE_RATIOS.get(workload, {}).get(baseline)})
    return {"rows": rows, "sustainable": sustainable, "ratios": ratios, "threshold": THRESHOLD, "setup": setup}


def figure_13(num_requests: int = 1000, seed: int = 0, progress: bool = False, setup: str = SETUP) -> list[dict]:
    """Mean batched requests at the caption's rates (ShareGPT 2 req/s, Alpaca 30 req/s), with the
    paper's: requests running per step over the steps until the last arrival (the load the arrivals
    sustain; the final drain of a finite trace, many short steps of a few stragglers, is left out)."""
    rows = []
    for workload, rate in FIGURE_13_RATES.items():
        requests = make_workload(workload, num_requests, seed, MAX_MODEL_LEN, rate)
        for system in tqdm(PAPER_SYSTEMS, disable=not progress, unit="run", desc=f"figure 13 {workload}"):
            res = _run(workload, rate, system, num_requests, seed, setup=setup)
            row = _latency_row(workload, system, rate, res)
            row["mean_batched_requests_all_steps"] = row["mean_batched_requests"]
            row["mean_batched_requests"] = res.mean_running_until(requests[-1].arrival)
            row["paper_mean_batched_requests"] = PAPER_CONCURRENCY[workload][system]
            rows.append(row)
    return rows


def figure_2(num_requests: int = 1000, seed: int = 0, rate: float = FIGURE_2_RATE, progress: bool = False,
             setup: str = SETUP) -> list[dict]:
    """The KV memory breakdown on ShareGPT at ``rate`` req/s, averaged over the run's steps: each
    category's share of the pool (``fragmentation``, with free memory) and token states' share of
    the memory in use (``token_state_share_of_in_use``, the paper's measure). Every system runs
    the paper's scheduler (``engine.experiments.paper_data.PAPER_SCHEDULER``)."""
    _check_rates([rate])
    rows = []
    for system in tqdm(PAPER_SYSTEMS, disable=not progress, unit="run", desc="figure 2"):
        res = _run("sharegpt", rate, system, num_requests, seed, setup=setup)
        rows.append({
            "workload": "sharegpt", "system": system, "request_rate": rate,
            "token_state_fraction": res.token_state_fraction, "fragmentation": res.fragmentation,
            "token_state_share_of_in_use": res.token_state_share_of_in_use,
            "mean_concurrent_requests": res.mean_concurrent_requests,
            "paper_token_state_fraction": PAPER_TOKEN_STATES[system], "paper_fragmentation": PAPER_FRAGMENTATION[system],
        })
    return rows


def figure_18b(num_requests: int = 1000, seed: int = 0, block_sizes=BLOCK_SIZES, progress: bool = False,
               setup: str = SETUP) -> dict:
    """vLLM's normalized latency for each block size at ``FIGURE_18_RATES``; the best sizes are those
    within 5% of the lowest latency. Returns {"rows", "best": {workload: [sizes]}, "paper_best", "rates"}."""
    if not block_sizes:
        raise ValueError("empty sweep: give at least one block size")
    rows = []
    with tqdm(total=len(block_sizes) * len(FIGURE_18_RATES), disable=not progress, unit="run", desc="figure 18b") as bar:
        for workload, rate in FIGURE_18_RATES.items():
            for bs in block_sizes:
                res = _run(workload, rate, "vLLM", num_requests, seed, block_size=bs, setup=setup)
                rows.append({**_latency_row(workload, "vLLM", rate, res), "block_size": bs})
                bar.update(1)
    best = {}
    for workload in FIGURE_18_RATES:
        mine = [r for r in rows if r["workload"] == workload]
        low = min(r["normalized_latency_s"] for r in mine)
        best[workload] = [r["block_size"] for r in mine if r["normalized_latency_s"] <= 1.05 * low]
    return {"rows": rows, "best": best, "paper_best": PAPER_BEST_BLOCK_SIZES, "rates": FIGURE_18_RATES}


# Figure 15 (OPT-13B): memory saved by sharing, blocks saved / blocks without sharing. Alpaca per
# setting as read off the figure; ShareGPT as the text gives it (16.2-30.5% and 44.3-66.3% over
# k = 2..6), so only its ends are paper numbers.
PAPER_SHARING = {
    ("alpaca", "parallel"): {2: 0.0609, 4: 0.0853, 6: 0.0979},
    ("alpaca", "beam"): {2: 0.3756, 4: 0.5313, 6: 0.5516},
    ("sharegpt", "parallel"): {2: 0.162, 6: 0.305},
    ("sharegpt", "beam"): {2: 0.443, 6: 0.663},
}


def figure_15(num_requests: int = 1000, seed: int = 0, widths: tuple[int, ...] = (2, 4, 6), progress: bool = False) -> list[dict]:
    """The paper's sharing experiment (§6.3, Figure 15) in the paper's set-up (OPT-13B on one
    A100-40GB: 15.7K slots, block size 16, the paper's scheduler ``PAPER_SCHEDULER``): memory saved by sharing for parallel sampling
    (``n``) and beam search (``beam_width``) on Alpaca and ShareGPT, all requests at once.

    Returns:
        One row per (workload, mode, k): ``workload``, ``mode`` ("parallel" or "beam"), ``k``,
        ``memory_saved_by_sharing`` (0..1), ``preemptions``, ``wall_seconds``, ``paper`` (None where
        the paper gives no number for that k).
    """
    rows = []
    workloads = ("alpaca", "sharegpt")
    with tqdm(total=len(workloads) * 2 * len(widths), disable=not progress, unit="run", desc="figure 15") as bar:
        for workload in workloads:
            requests = make_workload(workload, num_requests, seed, 2048)
            for mode in ("parallel", "beam"):
                for k in widths:
                    sharing = {"n": k} if mode == "parallel" else {"beam_width": k}
                    res = simulate(requests=requests, seed=seed, **PAPER_SCHEDULER, **sharing)
                    rows.append(dict(workload=workload, mode=mode, k=k, memory_saved_by_sharing=res.memory_saved_by_sharing,
                                     preemptions=res.preemptions, wall_seconds=res.wall_seconds,
                                     paper=PAPER_SHARING[(workload, mode)].get(k)))
                    bar.update(1)
    return rows


FIGURE16_RATES = (1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)  # req/s, for the throughput side


def reproduce_figure16(
    num_requests: int = 2000,
    seed: int = 0,
    kv_slots: int = 15_700,
    block_size: int = 16,
    max_num_seqs: int = 256,
    progress: bool = False,
    throughput_requests: int = 500,
    rates: tuple[float, ...] = FIGURE16_RATES,
) -> list[dict]:
    """Figure 16: every prompt begins with the same 1-shot (80 tokens) or 5-shot
    (341 tokens) prefix, then a translation workload (``engine/sim/workloads.py``, our length model).
    vLLM holds the prefix's full blocks once (prefix caching); Orca (Oracle) stores it in every
    request's range. LLaMA-13B has OPT-13B's KV size (40 layers x 40 heads x 128, fp16), so the pool is
    Table 1's 15.7K slots. All requests at time 0; shares and batch sizes while requests wait.

    The paper's ratios are *throughput* at equal latency. The throughput side serves
    ``throughput_requests`` of the same workload at each of ``rates`` (Poisson arrivals) with the
    step-time model ``a100-opt-13b-achieved`` (cached prefix tokens are not computed), and takes each
    system's sustainable rate as Figure 12 does (``engine.experiments.figures.sustainable_rate``).

    Returns:
        One row per (prefix, system): ``prefix``, ``prefix_tokens``, ``system``,
        ``mean_concurrent_requests``, ``token_state_fraction``, ``memory_saved_by_sharing``,
        ``preemptions``, ``sustainable_rate`` (req/s) and ``rate_reached`` (False: the sweep's top
        rate, a lower bound), and on the vLLM rows ``batch_ratio_over_orca_oracle``,
        ``throughput_ratio_over_orca_oracle`` and ``paper_throughput_ratio``.
    """
    from engine.experiments.figures import sustainable_rate  # it imports this module

    rows = []
    bar = tqdm(total=len(PAPER_PREFIX_SPEEDUP) * 2 * (1 + len(rates)), disable=not progress, unit="run", desc="figure 16")
    for name, (prefix, paper_ratio) in PAPER_PREFIX_SPEEDUP.items():
        requests = make_workload("translation", num_requests, seed, 2048 - prefix)
        by_system = {}
        for system in ("Orca (Oracle)", "vLLM"):
            res = simulate(requests=requests, kv_slots=kv_slots, block_size=block_size, max_num_seqs=max_num_seqs,
                           shared_prefix=prefix, **PAPER_SYSTEMS[system])
            bar.update(1)
            shares, concurrency = res.saturated()
            latencies = [simulate(requests=make_workload("translation", throughput_requests, seed, 2048 - prefix, request_rate=rate),
                                  kv_slots=kv_slots, block_size=block_size, max_num_seqs=max_num_seqs, shared_prefix=prefix,
                                  cost_model="a100-opt-13b-achieved", **PAPER_SYSTEMS[system]).normalized_latency_s for rate in rates]
            bar.update(len(rates))
            rate, reached = sustainable_rate(list(rates), latencies)
            by_system[system] = row = {
                "prefix": name, "prefix_tokens": prefix, "system": system, "mean_concurrent_requests": concurrency,
                "token_state_fraction": shares["token_states"], "memory_saved_by_sharing": res.memory_saved_by_sharing,
                "preemptions": res.preemptions, "sustainable_rate": rate, "rate_reached": reached,
            }
            rows.append(row)
        orca = by_system["Orca (Oracle)"]["mean_concurrent_requests"]
        by_system["vLLM"]["batch_ratio_over_orca_oracle"] = by_system["vLLM"]["mean_concurrent_requests"] / orca
        by_system["vLLM"]["throughput_ratio_over_orca_oracle"] = by_system["vLLM"]["sustainable_rate"] / by_system["Orca (Oracle)"]["sustainable_rate"]
        by_system["vLLM"]["paper_throughput_ratio"] = paper_ratio
    bar.close()
    return rows


def format_figure16_table(rows: list[dict]) -> str:
    """Figure 16 rows as a plain-text table: batch size, memory and throughput, the paper's ratio beside."""
    lines = [f"{'prefix':<7} {'system':<14} {'concurrent':>10} {'ratio':>6} {'saved by sharing':>16} "
             f"{'sustainable req/s':>17} {'ratio':>7} {'paper (throughput)':>18}"]
    for r in rows:
        ratio = f"{r['batch_ratio_over_orca_oracle']:.2f}x" if "batch_ratio_over_orca_oracle" in r else "1.00x"
        paper = f"{r['paper_throughput_ratio']:.2f}x" if "paper_throughput_ratio" in r else "1.00x"
        rate = f"{'>=' if not r['rate_reached'] else ''}{r['sustainable_rate']:.1f}"
        tput = f"{r['throughput_ratio_over_orca_oracle']:.2f}x" if "throughput_ratio_over_orca_oracle" in r else "1.00x"
        lines.append(f"{r['prefix']:<7} {r['system']:<14} {r['mean_concurrent_requests']:>10.2f} {ratio:>6} "
                     f"{r['memory_saved_by_sharing']:>16.1%} {rate:>17} {tput:>7} {paper:>18}")
    lines.append("concurrent and saved: all requests at once, while requests wait; sustainable rate: where normalized latency "
                 "crosses 2x its lowest-rate value (a100-opt-13b-achieved time model, as Figure 12; >= : a lower bound).")
    return "\n".join(lines)


# Requests per run: 1,000 for the sweeps; Figure 13 measures a batch that is still growing at
# Alpaca 30 req/s (vLLM is close to its sustainable rate there), so it runs a longer trace.
DEFAULT_REQUESTS = {"2": 1000, "12": 1000, "13": 3000, "15": 1000, "16": 2000, "18b": 1000, "19": 1000}


def reproduce_figure(figure: str, num_requests: int | None = None, seed: int = 0, progress: bool = False):
    """One figure's result by name ("2", "12", "13", "15", "16", "18b", "19"); ``num_requests`` None = its default.

    Raises:
        ValueError: an unknown figure, or num_requests < 1.
    """
    from engine.experiments.swap import figure_19

    runs = {"2": figure_2, "12": figure_12, "13": figure_13, "15": figure_15, "16": reproduce_figure16, "18b": figure_18b,
            "19": figure_19}
    if figure not in runs:
        raise ValueError(f"unknown figure {figure!r}; choose from {', '.join(FIGURES)}")
    num_requests = DEFAULT_REQUESTS[figure] if num_requests is None else num_requests
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    return runs[figure](num_requests=num_requests, seed=seed, progress=progress)


# --- Plain-text tables ---------------------------------------------------------------------------------


def format_figure(figure: str, result) -> str:
    """The figure's rows as a plain-text table, ours beside the paper's."""
    from engine.experiments.swap import format_figure_19

    formats = {"2": _format_2, "12": _format_12, "13": _format_13, "15": _format_15, "16": format_figure16_table, "18b": _format_18b,
               "19": format_figure_19}
    return formats[figure](result)


def _format_2(rows) -> str:
    lines = [f"Figure 2: KV cache on ShareGPT at {rows[0]['request_rate']:g} req/s ({SETUP}), share of the KV pool, ours (paper)",
             f"{'system':<14} {'token states':>14} {'reserved':>14} {'internal':>14} {'external+other':>16}"]
    for r in rows:
        f, p = r["fragmentation"], r["paper_fragmentation"]

        def cell(key, value):
            return f"{value:.1%} ({p[key]:.1%})" if key in p else f"{value:.1%}"

        lines.append(f"{r['system']:<14} {r['token_state_fraction']:>6.1%} ({r['paper_token_state_fraction']:.1%}) "
                     f"{cell('reserved', f['reserved']):>14} {cell('internal_fragmentation', f['internal_fragmentation']):>14} "
                     f"{cell('external_fragmentation', f['external_fragmentation'] + f['free']):>16}")
    lines.append("token states, share of the memory in use (the pool less its free part; the paper's measure):")
    for r in rows:
        lines.append(f"{r['system']:<14} {r['token_state_share_of_in_use']:>6.1%} ({r['paper_token_state_fraction']:.1%})")
    lines.append("free memory is not in use, not waste: the pool is not full at this rate")
    return "\n".join(lines)


def _format_12(result) -> str:
    lines = [f"Figure 12: normalized latency (s/token) against request rate ({result['setup']})"]
    rows = result["rows"]
    for workload in dict.fromkeys(r["workload"] for r in rows):
        rates = sorted({r["request_rate"] for r in rows if r["workload"] == workload})
        lines.append(_table_line(workload, rates, "{:>7g}") + "   req/s")
        for system in dict.fromkeys(r["system"] for r in rows):
            at = {r["request_rate"]: r["normalized_latency_s"] for r in rows if r["workload"] == workload and r["system"] == system}
            lines.append(_table_line(system, [f"{at[x]:.3f}" if x in at else "-" for x in rates], "{:>7}"))
    lines.append(f"sustainable rate: normalized latency under {result['threshold']:g}x its lowest-rate value")
    for s in result["sustainable"]:
        lines.append(f"  {s['workload']:<9} {s['system']:<17} {'' if s['reached'] else '>= '}{s['rate']:.2f} req/s")
    for r in result["ratios"]:
        lines.append(f"  {r['workload']:<9} vLLM / {r['baseline']:<17} {'>= ' if r['at_least'] else ''}{r['ratio']:.2f}x   "
                     f"(paper {paper_ratio_text(r['paper'])})")
    return "\n".join(lines)


def _format_13(rows) -> str:
    lines = [f"Figure 13: mean batched requests ({SETUP})", f"{'workload':<9} {'rate':>6} {'system':<14} {'ours':>8} {'paper':>8}"]
    for r in rows:
        lines.append(f"{r['workload']:<9} {r['request_rate']:>6g} {r['system']:<14} {r['mean_batched_requests']:>8.2f} "
                     f"{r['paper_mean_batched_requests']:>8.2f}")
    return "\n".join(lines)


def _format_18b(result) -> str:
    lines = [f"Figure 18b: vLLM's normalized latency (s/token) against block size ({SETUP})"]
    rows = result["rows"]
    sizes = sorted({r["block_size"] for r in rows})
    lines.append(_table_line("workload", sizes, "{:>7d}"))
    for workload, rate in result["rates"].items():
        vals = [r["normalized_latency_s"] for r in rows if r["workload"] == workload]
        lines.append(_table_line(f"{workload} {rate:g}/s", vals))
    for workload, best in result["best"].items():
        lo, hi = result["paper_best"][workload]
        lines.append(f"  {workload}: best (within 5%) {best}; paper: {lo}-{hi}")
    return "\n".join(lines)


def _format_15(rows) -> str:
    lines = ["Figure 15: memory saved by sharing (blocks saved / blocks without sharing), ours (paper)",
             f"{'workload':<9} {'sharing':<9} {'k':>2} {'memory saved':>12} {'paper':>7}"]
    for r in rows:
        paper = f"{r['paper']:.1%}" if r["paper"] is not None else "-"
        lines.append(f"{r['workload']:<9} {r['mode']:<9} {r['k']:>2} {r['memory_saved_by_sharing']:>12.1%} {paper:>7}")
    return "\n".join(lines)


def _table_line(label: str, values, fmt: str = "{:>7.3f}") -> str:
    return f"{label:<18} " + " ".join(fmt.format(v) for v in values)
