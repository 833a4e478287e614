"""Swap against recompute (PagedAttention paper §4.5 and §7.3, Figure 19) on the simulator, with time.

Two ways to give a preempted request's memory up:

- *recompute*: free its blocks and prefill its tokens again later (compute: the same cost at every
  block size);
- *swap*: copy its blocks to a CPU swap space and back (PCIe traffic: one copy per block, layer and
  K/V, so small blocks mean many small copies whose fixed costs dominate).

Figure 19 (a) prices one preemption both ways by block size with the step-time model
(``engine/sim/cost_model.py``); (b) serves the ShareGPT trace at one request rate both ways, with the
copies on the steps' critical path, and reports the normalized latency. The paper found swapping
expensive at small blocks, recompute never above 20% of swapping's latency, and the two comparable
at blocks of 16-64 (our ``../shared/reference/paper-facts.md``).

The token-state table asks the question behind the paper's 96% (Figure 2): which policy leaves the
fewest blocks idle while requests wait, at saturation (3,000 requests at once, as the README's memory table)?
"""

from __future__ import annotations

from tqdm import tqdm

from engine.sim.cost_model import OPT_13B, get_setup
from engine.experiments.paper_data import PAPER_SCHEDULER
from engine.sim.simulator import simulate
from engine.sim.workloads import make_workload

SETUP = "a100-opt-13b-achieved"  # OPT-13B (OPT_13B: its KV bytes per token) on one A100-40GB
BLOCK_SIZES_A = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BLOCK_SIZES_B = (8, 16, 32, 64, 128, 256)
FIGURE19_RATE = 2.0  # req/s on ShareGPT: near vLLM's knee on OPT-13B (Figure 12a), where preemptions happen
# Whole prompts run the paper's scheduler (engine.experiments.paper_data.PAPER_SCHEDULER), chunked prefill v1's.
POLICIES = {
    "recompute": dict(PAPER_SCHEDULER),
    "swap": dict(preemption_mode="swap", **PAPER_SCHEDULER),
    "chunked prefill (recompute)": dict(enable_chunked_prefill=True, max_num_batched_tokens=2048),
    "chunked prefill + swap": dict(enable_chunked_prefill=True, max_num_batched_tokens=2048, preemption_mode="swap"),
}


def figure_19(num_requests: int = 1000, seed: int = 0, progress: bool = False, request_rate: float = FIGURE19_RATE,
              token_state_requests: int = 3000) -> dict:
    """Figure 19 and the token-state table.

    Returns:
        {"setup", "request_rate", "tokens_per_preemption" (the mean tokens a recompute preemption
        threw away at block size 16, the size of the request that (a) prices),
        "a": [{"block_size", "swap_out_ms", "swap_in_ms", "swap_ms" (in + out), "recompute_ms"}],
        "b": [{"block_size", "mode", "normalized_latency_s", "preemptions", "blocks_swapped" (out + in),
        "gb_swapped", "tokens_recomputed"}],
        "token_states": [{"workload", "policy", "token_state_fraction" (while requests wait),
        "preemptions", "swap_outs", "tokens_recomputed"}]}.
    """
    setup = get_setup(SETUP)
    model = setup.cost_model
    requests = make_workload("sharegpt", num_requests, seed, setup.max_model_len, request_rate=request_rate)
    common = dict(kv_slots=setup.kv_slots, max_model_len=setup.max_model_len, cost_model=model, **PAPER_SCHEDULER)
    rows_b, per_preemption = [], None
    bar = tqdm(total=2 * len(BLOCK_SIZES_B), disable=not progress, unit="run", desc="figure 19b")
    for block_size in BLOCK_SIZES_B:
        for mode in ("recompute", "swap"):
            res = simulate(requests=requests, block_size=block_size, preemption_mode=mode, **common)
            bar.update(1)
            blocks = res.blocks_swapped_out + res.blocks_swapped_in
            rows_b.append({
                "block_size": block_size, "mode": mode, "normalized_latency_s": res.normalized_latency_s,
                "preemptions": res.preemptions, "blocks_swapped": blocks,
                "gb_swapped": blocks * block_size * OPT_13B.kv_bytes_per_token / 1e9,
                "tokens_recomputed": res.tokens_recomputed,
            })
            if block_size == 16 and mode == "recompute" and res.preemptions:
                per_preemption = round(res.tokens_recomputed / res.preemptions)
    bar.close()
    tokens = per_preemption or 512
    rows_a = []
    for block_size in BLOCK_SIZES_A:
        num_blocks = -(-tokens // block_size)
        one_way = model.swap_time(num_blocks, num_blocks * block_size)
        rows_a.append({"block_size": block_size, "swap_out_ms": 1e3 * one_way, "swap_in_ms": 1e3 * one_way,
                       "swap_ms": 2e3 * one_way, "recompute_ms": 1e3 * model.recompute_time(tokens, block_size)})
    return {"setup": setup.description, "request_rate": request_rate, "tokens_per_preemption": tokens,
            "a": rows_a, "b": rows_b, "token_states": token_states_by_policy(token_state_requests, seed, progress)}


def token_states_by_policy(num_requests: int = 3000, seed: int = 0, progress: bool = False) -> list[dict]:
    """The paged pool's token-state share while requests wait, in the paper's memory set-up (15.7K
    slots, block 16, all requests at once; ``engine.experiments.memory.reproduce_paper``'s), per policy."""
    rows = []
    bar = tqdm(total=2 * len(POLICIES), disable=not progress, unit="run", desc="token states by policy")
    for workload in ("sharegpt", "alpaca"):
        requests = make_workload(workload, num_requests, seed, 2048)
        for policy, overrides in POLICIES.items():
            res = simulate(requests=requests, kv_slots=15_700, block_size=16, max_model_len=2048, **overrides)
            bar.update(1)
            shares, _ = res.saturated()
            rows.append({"workload": workload, "policy": policy, "token_state_fraction": shares["token_states"],
                         "preemptions": res.preemptions, "swap_outs": res.swap_outs, "tokens_recomputed": res.tokens_recomputed})
    bar.close()
    return rows


def format_figure_19(result: dict) -> str:
    """Figure 19 and the token-state table as plain text."""
    lines = [f"Figure 19 (§7.3): swap against recompute, {result['setup']}",
             f"(a) one preemption of {result['tokens_per_preemption']} tokens (the mean a recompute preemption threw away "
             "in (b) at block 16), ms",
             f"{'block size':>10} {'swap out':>9} {'swap in':>9} {'swap in+out':>12} {'recompute':>10}"]
    for r in result["a"]:
        lines.append(f"{r['block_size']:>10} {r['swap_out_ms']:>9.1f} {r['swap_in_ms']:>9.1f} {r['swap_ms']:>12.1f} {r['recompute_ms']:>10.1f}")
    lines += [f"(b) ShareGPT at {result['request_rate']:g} req/s: normalized latency (s/token), preemptions, what moved",
              f"{'block size':>10} {'mode':>10} {'latency':>8} {'preempt':>8} {'blocks moved':>13} {'GB moved':>9} {'tokens recomputed':>18}"]
    for r in result["b"]:
        lines.append(f"{r['block_size']:>10} {r['mode']:>10} {r['normalized_latency_s']:>8.3f} {r['preemptions']:>8} "
                     f"{r['blocks_swapped']:>13} {r['gb_swapped']:>9.2f} {r['tokens_recomputed']:>18}")
    lines += ["Paper: swapping is expensive at small blocks; recompute is never above 20% of swapping's latency; comparable at 16-64.",
              "Token states while requests wait (paper set-up: 15.7K slots, block 16, all at once; the paper's vLLM: 96.3%)",
              f"{'workload':<9} {'policy':<28} {'token states':>12} {'preempt':>8} {'swap outs':>9} {'tokens recomputed':>18}"]
    for r in result["token_states"]:
        lines.append(f"{r['workload']:<9} {r['policy']:<28} {r['token_state_fraction']:>12.1%} {r['preemptions']:>8} "
                     f"{r['swap_outs']:>9} {r['tokens_recomputed']:>18}")
    return "\n".join(lines)
