"""KV memory per request against context length: a model whose layers are all full attention against
the same model with Gemma 3's pattern (5 sliding-window layers to 1 full, Gemma Team 2025, §2), both
on the simulator's hybrid KV cache manager (``engine/core/kv_cache_coordinator.py``), block for block.

``python -m visualize.hybrid_kv --out docs/figure-hybrid-kv.png`` draws it; ``--json`` prints the rows.
"""

from __future__ import annotations

from engine.core.kv_cache_interface import FULL_ATTENTION, gemma3_layer_types, get_kv_cache_groups, layer_specs
from engine.sim.simulator import simulate
from engine.sim.workloads import Request

# Gemma 3 270M (its config.json): 18 layers, 1 KV head of 256, a window of 512, served in bf16.
GEMMA3_270M = {"num_layers": 18, "num_kv_heads": 1, "head_dim": 256, "sliding_window": 512, "dtype_size": 2}

# Gemma Team 2025, Gemma 3 Technical Report (arXiv:2503.19786), Figure 5: at a 32K-token KV cache,
# a 2B model's KV cache is a 60% memory overhead with global attention only, under 15% with
# local:global 1:3 and a sliding window of 1,024; Figure 6 draws the KV memory against context length
# for 5:1 against global only.
PAPER_OVERHEAD_GLOBAL_ONLY, PAPER_OVERHEAD_LOCAL_GLOBAL = 0.60, 0.15


def kv_memory_vs_context(context_len: int = 32_768, prompt_len: int = 1024, block_size: int = 16,
                         model: dict | None = None, every: int = 1024) -> list[dict]:
    """One request of ``prompt_len`` prompt tokens decoding to ``context_len`` tokens, simulated twice:
    every layer full attention, and Gemma 3's 5:1 pattern. After each step the KV blocks the request
    holds, over all groups, in bytes.

    Returns:
        One row per ``every`` tokens of context (and the last): ``context_len`` (tokens), ``full_bytes``,
        ``hybrid_bytes`` (whole blocks in use, K and V, every layer), and ``ratio`` = full / hybrid.
    """
    shape = dict(GEMMA3_270M, **(model or {}))
    curves = {}
    for name, types in (("full", [FULL_ATTENTION] * shape["num_layers"]), ("hybrid", gemma3_layer_types(shape["num_layers"]))):
        specs = layer_specs(shape["num_layers"], block_size, shape["num_kv_heads"], shape["head_dim"], shape["dtype_size"],
                            sliding_window=shape["sliding_window"], layer_types=types)
        groups = get_kv_cache_groups(specs)
        page_bytes = max(len(g.layer_names) for g in groups) * next(iter(specs.values())).page_size_bytes
        blocks = len(groups) * -(-context_len // block_size) + 1  # room for the request to be prefilled again in every group
        result = simulate(requests=[Request(0.0, prompt_len, context_len - prompt_len)], kv_slots=blocks * block_size,
                          block_size=block_size, max_model_len=context_len, kv_cache_spec=specs, record_steps=True,
                          enable_prefix_caching=False, max_num_batched_tokens=context_len)
        curves[name] = {r.scheduled[0].num_computed_tokens: r.memory.blocks_with_sharing * page_bytes
                        for r in result.step_reports if r.scheduled}
    lens = [n for n in sorted(curves["full"]) if n % every == 0 or n == max(curves["full"]) or n == prompt_len]
    return [{"context_len": n, "full_bytes": curves["full"][n], "hybrid_bytes": curves["hybrid"][n],
             "ratio": curves["full"][n] / curves["hybrid"][n]} for n in lens]
