"""The numbers the PagedAttention paper reports (Kwon et al., SOSP 2023), beside which the lab's
reproductions are printed and drawn, and the systems it compares (as simulator settings).

Plain data: importing it loads nothing else.
"""

PAPER_FIGURES = ("2", "12", "13", "15", "16", "18b", "19")  # engine/experiments/figures.py (19: engine/experiments/swap.py)

# Kwon et al., SOSP 2023. Figure 2: share of the KV space holding token states (the §6.2 experiment,
# stated in the text for the Orca baselines). Figure 13: mean batched requests, OPT-13B.
# The scheduler of the paper's experiments: its prototype's, as released in vLLM 0.1 (2023). Running
# requests decode first and waiting prompts join the same step while running + prompt tokens fit
# max_num_batched_tokens, vLLM 0.1's default of 2,560: a 2,048-token prompt beside 256 decodes
# always fits, so no prompt waits for budget while memory is free (engine/core/scheduler.py).
PAPER_SCHEDULER = dict(schedule_first="decodes", max_num_batched_tokens=2560)

PAPER_SYSTEMS = {
    "Orca (Max)": dict(allocator="contiguous", reservation="max", placement="buddy", **PAPER_SCHEDULER),
    "Orca (Pow2)": dict(allocator="contiguous", reservation="pow2", placement="buddy", **PAPER_SCHEDULER),
    "Orca (Oracle)": dict(allocator="contiguous", reservation="oracle", placement="buddy", **PAPER_SCHEDULER),
    "vLLM": dict(allocator="paged", **PAPER_SCHEDULER),
}

# The scheduler rules the app offers (app_pages/compare.py): the paper's (above), vLLM v0's
# prefill-first default, vLLM v1's with chunked prefill (a 2,048-token budget), and the decodes-first
# rule on whole prompts with a 2,048-token budget, where a ~2K-token prompt at the head of the queue
# waits for the budget the running decodes leave.
SCHEDULER_RULES = {
    "paper": PAPER_SCHEDULER,
    "prefills": dict(schedule_first="prefills"),
    "chunked": dict(schedule_first="decodes", enable_chunked_prefill=True, max_num_batched_tokens=2048),
    "decodes": dict(schedule_first="decodes"),
}

PAPER_TOKEN_STATES = {"Orca (Max)": 0.204, "Orca (Pow2)": 0.268, "Orca (Oracle)": 0.382, "vLLM": 0.963}

PAPER_FRAGMENTATION = {  # Figure 2's other bar segments, as read off the figure
    "Orca (Max)": {"reserved": 0.133, "internal_fragmentation": 0.573, "external_fragmentation": 0.089},
    "Orca (Pow2)": {"reserved": 0.179, "internal_fragmentation": 0.136, "external_fragmentation": 0.416},
    "Orca (Oracle)": {"reserved": 0.252, "internal_fragmentation": 0.0, "external_fragmentation": 0.366},
    "vLLM": {},
}

PAPER_CONCURRENCY = {
    "sharegpt": {"Orca (Max)": 7.00, "Orca (Pow2)": 9.81, "Orca (Oracle)": 13.62, "vLLM": 30.42},
    "alpaca": {"Orca (Max)": 7.00, "Orca (Pow2)": 43.24, "Orca (Oracle)": 72.75, "vLLM": 132.44},
}

# Figure 16 (§6.4): LLaMA-13B translating WMT16 En-De with a shared few-shot prefix; vLLM's
# throughput over Orca (Oracle) at the same latency.
PAPER_PREFIX_SPEEDUP = {"1-shot": (80, 1.67), "5-shot": (341, 3.58)}
