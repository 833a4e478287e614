"""The paper's memory experiment at saturation (§6.2, Figures 2 and 13): the share of the KV pool
holding token states and the number of requests batched, vLLM against Orca Max / Pow2 / Oracle, all
requests at once on the simulator (``python -m visualize reproduce-paper`` without ``--figure``)."""

from __future__ import annotations

from tqdm import tqdm

from engine.core.accounting import in_use_shares
from engine.sim.workloads import make_workload
from engine.experiments.paper_data import PAPER_CONCURRENCY, PAPER_FRAGMENTATION, PAPER_SYSTEMS, PAPER_TOKEN_STATES
from engine.sim.simulator import simulate


def reproduce_paper(
    num_requests: int = 5000,
    workloads: tuple[str, ...] = ("sharegpt", "alpaca"),
    seed: int = 0,
    kv_slots: int = 15_700,
    block_size: int = 16,
    max_model_len: int = 2048,
    max_num_seqs: int = 256,
    watermark: float = 0.01,
    progress: bool = False,
) -> list[dict]:
    """The paper's memory experiment: OPT-13B on one A100-40GB (15.7K token slots, Table 1), block
    size 16, max length 2048, all requests at once; vLLM (paged, with vLLM's admission watermark of
    ``watermark`` = 1% of the blocks) against Orca Max / Pow2 / Oracle.

    Shares and concurrency are measured while requests wait (:meth:`SimulationResult.saturated`),
    i.e. under load as in the paper's serving experiments; the ``*_all_steps`` fields include the
    final drain of the batch.

    Returns:
        One row per (workload, system): ``workload``, ``system``, ``token_state_fraction`` (share of
        the pool), ``token_state_share_of_in_use`` (of the memory in use, the paper's measure),
        ``fragmentation`` (share per category), ``mean_concurrent_requests``, the same two over all
        steps (``token_state_fraction_all_steps``, ``mean_concurrent_requests_all_steps``), ``preemptions``,
        ``paper_token_state_fraction`` (Figure 2, given for the ShareGPT rows only),
        ``paper_fragmentation`` and ``paper_mean_concurrent_requests`` (Figure 13).
    """
    rows = []
    bar = tqdm(total=len(workloads) * len(PAPER_SYSTEMS), disable=not progress, unit="run", desc="memory table")
    for workload in workloads:
        requests = make_workload(workload, num_requests, seed, max_model_len)
        for system, overrides in PAPER_SYSTEMS.items():
            res = simulate(requests=requests, kv_slots=kv_slots, block_size=block_size, max_model_len=max_model_len,
                           max_num_seqs=max_num_seqs, watermark=watermark, **overrides)
            bar.update(1)
            shares, concurrency = res.saturated()
            on_fig2 = workload == "sharegpt"
            rows.append({
                "workload": workload,
                "system": system,
                "token_state_fraction": shares["token_states"],
                "token_state_share_of_in_use": in_use_shares(shares)["token_states"],
                "fragmentation": shares,
                "mean_concurrent_requests": concurrency,
                "token_state_fraction_all_steps": res.token_state_fraction,
                "mean_concurrent_requests_all_steps": res.mean_concurrent_requests,
                "preemptions": res.preemptions,
                "paper_token_state_fraction": PAPER_TOKEN_STATES[system] if on_fig2 else None,
                "paper_fragmentation": PAPER_FRAGMENTATION[system] if on_fig2 else None,
                "paper_mean_concurrent_requests": PAPER_CONCURRENCY[workload][system],
            })
    bar.close()
    return rows


def format_paper_table(rows: list[dict]) -> str:
    """The rows as a plain-text table, ours beside the paper's."""
    lines = [f"{'':<24} {'token states, share of':>27}",
             f"{'workload':<9} {'system':<14} {'the pool':>9} {'memory in use':>13} {'paper':>7} {'concurrent':>10} {'paper':>7}"]
    for r in rows:
        paper_ts = f"{r['paper_token_state_fraction']:.1%}" if r["paper_token_state_fraction"] is not None else "-"
        lines.append(f"{r['workload']:<9} {r['system']:<14} {r['token_state_fraction']:>9.1%} {r['token_state_share_of_in_use']:>13.1%} "
                     f"{paper_ts:>7} {r['mean_concurrent_requests']:>10.2f} {r['paper_mean_concurrent_requests']:>7.2f}")
    lines.append("while requests wait (the pool under load); memory in use = the pool less its free part (the paper's measure)")
    return "\n".join(lines)
