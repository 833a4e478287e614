"""The numbers the PagedAttention paper reports (Kwon et al., SOSP 2023), beside which the lab's
reproductions are printed and drawn, and the systems it compares (as simulator settings).

Plain data: importing it loads nothing else.
"""

PAPER_FIGURES = ("2", "12", "13", "15", "16", "18b", "19")  # engine/experiments/figures.py (19: engine/experiments/swap.py)

# Kwon et al., SOSP 2023. Figure 2: share of the KV space holding token states (the §6.2 experiment,
# stated in the text for the Orca baselines). Figure 13: mean batched requests, OPT-13B.
PAPER_SYSTEMS = {
    "Orca (Max)": dict(allocator="contiguous", reservation="max", placement="buddy"),
    "Orca (Pow2)": dict(allocator="contiguous", reservation="pow2", placement="buddy"),
    "Orca (Oracle)": dict(allocator="contiguous", reservation="oracle", placement="buddy"),
    "vLLM": dict(allocator="paged"),
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
