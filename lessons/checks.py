"""What the lessons' check cells compare an answer with, computed here rather than in the check cell, so
that the expected value is neither printed on the page nor written out beside the exercise.

A check imports this module (the lesson's first cell puts the repository root on ``sys.path``). Each
function recomputes its expected value from the lesson's inputs, never from a number the notebook
has already printed.
"""

from __future__ import annotations


def speculative_expectation(alpha: float, k: int, plain_step_ms: float, verify_step_ms: float) -> tuple[float, float]:
    """Lesson 10: the tokens a verification gives on average and the speed-up at batch 1.

    ``alpha`` is the chance that the model accepts a draft it judges (0 <= alpha <= 1, accepted / judged
    drafts), ``k`` the drafts per step, the step times in milliseconds. Returns ``(E, speed-up)``:
    E = 1 + alpha + ... + alpha**k (Leviathan et al., 2023, §3.3), and E tokens per ``verify_step_ms``
    against 1 token per ``plain_step_ms``. Raises ValueError for alpha outside [0, 1], k < 1 or a step
    time that is not positive.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if plain_step_ms <= 0 or verify_step_ms <= 0:
        raise ValueError(f"step times must be positive, got {plain_step_ms} and {verify_step_ms} ms")
    tokens = sum(alpha ** i for i in range(k + 1))
    return tokens, tokens * plain_step_ms / verify_step_ms


def hybrid_blocks_in_use(prompt_len: int, num_computed_tokens: int, block_size: int = 16, sliding_window: int = 512,
                         num_layers: int = 18) -> int:
    """Lesson 11: the blocks one request holds, over every KV cache group of Gemma 3's pattern, after the
    step that brings it to ``num_computed_tokens`` tokens computed (its ``prompt_len``-token prompt
    prefilled whole, then one token per decode step). Runs the engine's hybrid KV cache manager and
    scheduler (no model: the blocks depend on the lengths only). Raises ValueError when
    ``num_computed_tokens`` is not between ``prompt_len`` and a 4,096-token request's end.
    """
    from engine.core.kv_cache_coordinator import HybridKVCacheCoordinator
    from engine.core.kv_cache_interface import gemma3_layer_types, get_kv_cache_config, layer_specs
    from engine.core.scheduler import Scheduler
    from engine.core.sequence import Sequence, SequenceGroup

    end = 4096
    if not prompt_len <= num_computed_tokens < end:
        raise ValueError(f"num_computed_tokens must be in [{prompt_len}, {end}), got {num_computed_tokens}")
    specs = layer_specs(num_layers, block_size, 1, 256, sliding_window=sliding_window, layer_types=gemma3_layer_types(num_layers))
    config = get_kv_cache_config(specs, num_blocks=1 + len(specs) * -(-end // block_size))
    kv = HybridKVCacheCoordinator(config, block_size)
    scheduler = Scheduler(kv, 1, end)
    seq = Sequence(0, prompt_len, max_len=end)
    scheduler.add(SequenceGroup(0, [seq]))
    while seq.num_computed_tokens < num_computed_tokens:
        for ready in scheduler.update_from_output(scheduler.schedule()):
            ready.append_token()
    return sum(g.num_blocks_in_use for g in kv.kv_groups(scheduler.running))
