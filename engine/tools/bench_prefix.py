"""``python -m engine bench-prefix``: prefix caching measured side by side, on the simulator and on the
real engine: the hash chain vs the radix tree, FCFS vs longest-prefix-match scheduling, with and
without the CPU offload tier, at two cache sizes, plus a run without prefix caching.

Columns: the prefix-cache hit rate (prompt tokens found cached / prompt tokens, first prefills),
the prefill tokens computed, TTFT p50 and p99, and output tokens/s.

- The simulator (``engine/sim/``) runs the engine's scheduler and allocator on ``--sim-requests``
  requests of the "multiturn" and "fewshot" workloads (``engine/sim/workloads.py``) with Poisson
  arrivals, its clock the ``--cost-model`` step-time model (the CPU tier's copies cost PCIe time).
- The engine runs the default model on CPU, at most 4 requests at a time: a small few-shot workload
  (4 tasks, 96-token prefixes, questions of ~24 tokens, 8 new tokens each), all queued at once, and a
  multi-turn replay where each conversation sends its next turn when the last one finished. Times
  are wall-clock. Requests admitted in the same step cannot hit each other (a block is cached once
  its KV is written), so the first few requests of a run always miss.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

CONFIGS = [(cache, policy, offload) for cache in ("hash", "radix") for policy in ("fcfs", "lpm") for offload in (False, True)]
COLUMNS = ("side", "workload", "cache_blocks", "config", "hit_rate", "prefill_tokens", "ttft_p50_s", "ttft_p99_s", "tokens_per_s")


def config_name(caching: bool, cache: str = "", policy: str = "", offload: bool = False) -> str:
    return "no caching" if not caching else f"{cache} {policy}" + (" +offload" if offload else "")


# --- The simulator -----------------------------------------------------------------------------------

def simulator_rows(workload: str, num_requests: int, request_rate: float, cache_blocks: list[int], offload_blocks: int,
                   cost_model: str, seed: int = 0, block_size: int = 16) -> list[dict]:
    """One row per configuration and cache size on the simulator (plus one without caching per size)."""
    from engine.sim.simulator import simulate

    rows = []
    for blocks in cache_blocks:
        runs = [(False, "hash", "fcfs", False)] + [(True, *c) for c in CONFIGS]
        for caching, cache, policy, offload in runs:
            r = simulate(workload=workload, num_requests=num_requests, request_rate=request_rate, kv_slots=blocks * block_size,
                         block_size=block_size, cost_model=cost_model, seed=seed, enable_prefix_caching=caching,
                         prefix_cache=cache, scheduling_policy=policy, kv_offload_blocks=offload_blocks if offload else 0)
            queries = r.prefix_cache_queries or sum(req.prompt_len for req in _requests(workload, num_requests, seed, request_rate))
            rows.append(dict(side="simulator", workload=workload, cache_blocks=blocks, config=config_name(caching, cache, policy, offload),
                             hit_rate=r.prefix_cache_hits / queries if caching else 0.0, prefill_tokens=r.prefill_tokens_computed,
                             ttft_p50_s=r.ttft_percentile_s(50), ttft_p99_s=r.ttft_percentile_s(99),
                             tokens_per_s=r.throughput_tokens_per_s))
            _progress(rows[-1])
    return rows


def _requests(workload: str, num_requests: int, seed: int, request_rate: float):
    from engine.sim.workloads import make_workload

    return make_workload(workload, num_requests, seed, 2048, request_rate)


# --- The real engine ---------------------------------------------------------------------------------

def engine_rows(workload: str, cache_blocks: list[int], offload_blocks: int, num_requests: int = 24, seed: int = 0,
                loaded=None) -> list[dict]:
    """One row per configuration and pool size on the engine (default model), plus one without caching."""
    from engine.model_executor.model_loader import load_model

    loaded = loaded or load_model(None)
    rows = []
    for blocks in cache_blocks:
        runs = [(False, "hash", "fcfs", False)] + [(True, *c) for c in CONFIGS]
        for caching, cache, policy, offload in runs:
            row = run_engine(loaded, workload, blocks, caching, cache, policy, offload_blocks if offload else 0, num_requests, seed)
            rows.append(dict(side="engine", workload=workload, cache_blocks=blocks, config=config_name(caching, cache, policy, offload), **row))
            _progress(rows[-1])
    return rows


def engine_requests(workload: str, num_requests: int, seed: int, vocab_size: int):
    """The engine's small workload: (prompt token ids, max_tokens, conversation, turn) per request. The
    workloads' synthetic ids are mapped into the model's vocabulary (equal ids stay equal)."""
    from engine.sim.workloads import fewshot_workload, multiturn_workload

    if workload == "fewshot":
        reqs = fewshot_workload(num_requests, seed, 512, None, num_tasks=4, prefix_len=96, mean_question=24, mean_answer=8)
    else:
        reqs = multiturn_workload(num_requests, seed, 512, None, mean_user=24, mean_answer=8, mean_turns=4, think_s=0.0)
    out, conversation = [], {}
    for r in reqs:
        ids = [100 + (t * 2654435761) % (vocab_size - 200) for t in r.token_ids]
        prompt = ids[: r.prompt_len]
        conv = next((c for c, last in conversation.items() if prompt[: len(last)] == last), len(conversation))  # multiturn: whose history
        conversation[conv] = ids
        out.append((prompt, min(r.output_len, 8), conv))
    return out


def run_engine(loaded, workload: str, num_blocks: int, caching: bool, cache: str, policy: str, offload_blocks: int,
               num_requests: int, seed: int) -> dict:
    """Greedy, ignore_eos; fewshot: every request queued at once; multiturn: a conversation's next turn
    is queued when its last turn finished. TTFT: wall time from queueing to the end of the step that
    produced the first token."""
    from engine import EngineConfig, LLMEngine, SamplingParams

    engine = LLMEngine(EngineConfig(num_gpu_blocks=num_blocks, block_size=16, max_num_seqs=4, seed=seed, enable_prefix_caching=caching,
                                    prefix_cache=cache, scheduling_policy=policy if caching else "fcfs",
                                    kv_offload_blocks=offload_blocks if caching else 0), loaded_model=loaded)
    requests = engine_requests(workload, num_requests, seed, engine.hf_config.vocab_size)
    pending: dict[int, list] = {}
    for prompt, max_tokens, conv in requests:
        pending.setdefault(conv if workload == "multiturn" else len(pending), []).append((prompt, max_tokens))
    queued_at, first_at, live = {}, {}, {}

    def queue(key):
        prompt, max_tokens = pending[key].pop(0)
        rid = engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        queued_at[rid], live[rid] = time.perf_counter(), key

    for key in pending:
        queue(key)
    start, prefill_tokens, output_tokens = time.perf_counter(), 0, 0
    while engine.has_unfinished_requests():
        report = engine.step()
        now = time.perf_counter()
        prefill_tokens += sum(s.num_tokens for s in report.scheduled if s.phase == "prefill")
        for rid, tokens in report.new_token_ids.items():
            first_at.setdefault(rid, now)
            output_tokens += len(tokens)
        for rid in report.finished:
            key = live.pop(rid)
            if pending[key]:
                queue(key)
    elapsed = time.perf_counter() - start
    stats = engine.prefix_cache_stats()
    ttft = np.array([first_at[r] - queued_at[r] for r in queued_at])
    return dict(hit_rate=stats.hit_rate if stats else 0.0, prefill_tokens=prefill_tokens, ttft_p50_s=float(np.percentile(ttft, 50)),
                ttft_p99_s=float(np.percentile(ttft, 99)), tokens_per_s=output_tokens / elapsed)


# --- The table ---------------------------------------------------------------------------------------

def format_table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    head = "| side | workload | cache blocks | config | hit rate | prefill tokens | TTFT p50 (s) | TTFT p99 (s) | output tok/s |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r['side']} | {r['workload']} | {r['cache_blocks']} | {r['config']} | {r['hit_rate']:.1%} | {r['prefill_tokens']:,} | "
                     f"{_num(r['ttft_p50_s'])} | {_num(r['ttft_p99_s'])} | {r['tokens_per_s']:,.1f} |")
    return "\n".join(lines)


def _progress(row: dict) -> None:
    print(format_table([row]).splitlines()[-1], file=sys.stderr, flush=True)


def _num(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:.3f}"


def main(args: argparse.Namespace) -> None:
    rows = []
    for workload in args.workloads:
        if args.sim_requests:
            rows += simulator_rows(workload, args.sim_requests, args.request_rate, args.sim_cache_blocks, args.sim_offload_blocks,
                                   args.cost_model, args.seed)
    if args.engine:
        from engine.model_executor.model_loader import load_model

        loaded = load_model(None)
        for workload in args.workloads:
            rows += engine_rows(workload, args.engine_cache_blocks, args.engine_offload_blocks, args.engine_requests, args.seed, loaded)
    print(format_table(rows))


def register_cli(sub) -> None:
    p = sub.add_parser("bench-prefix", help="prefix caching side by side: hash vs radix, FCFS vs LPM, with and without the CPU tier")
    p.add_argument("--workloads", nargs="+", choices=["multiturn", "fewshot"], default=["multiturn", "fewshot"])
    p.add_argument("--sim-requests", type=int, default=10_000, help="simulated requests per run (0: skip the simulator; default 10,000)")
    p.add_argument("--request-rate", type=float, default=2.0, help="simulator: Poisson arrivals, requests/s (default 2)")
    p.add_argument("--sim-cache-blocks", type=int, nargs=2, default=[400, 1600], help="simulator: GPU pool sizes in blocks of 16 (default 400 1600)")
    p.add_argument("--sim-offload-blocks", type=int, default=4000, help="simulator: CPU tier blocks with offload (default 4000)")
    p.add_argument("--cost-model", default="a100-opt-13b", help="simulator: the step-time preset (default a100-opt-13b)")
    p.add_argument("--engine", action=argparse.BooleanOptionalAction, default=True, help="also run the real engine (default model, CPU)")
    p.add_argument("--engine-requests", type=int, default=24, help="engine: requests per run (default 24)")
    p.add_argument("--engine-cache-blocks", type=int, nargs=2, default=[24, 96], help="engine: pool sizes in blocks of 16 (default 24 96)")
    p.add_argument("--engine-offload-blocks", type=int, default=64, help="engine: CPU tier blocks with offload (default 64)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=main)
