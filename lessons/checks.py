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


def radix_exercise_expectation(make_engine, run, system: list[int]) -> tuple[int, int]:
    """Lesson 13: conversation A's second turn on the engine of section 2 (a radix tree over 8 blocks
    of 4, a CPU tier of 4 blocks, after A's and B's first turns and a long unrelated prompt). Returns
    its ``num_cached_tokens`` (both tiers) and the tokens of those loaded back from the CPU tier.

    ``make_engine(offload)`` builds the lesson's engine, ``run(engine, prompt)`` runs one request to its
    end and returns ``(RequestOutput, reports)``; ``system`` is the lesson's system prompt.
    """
    engine = make_engine(4)
    a1 = system + list(range(200, 206))
    out_a1, _ = run(engine, a1)
    run(engine, system + list(range(300, 306)))
    run(engine, list(range(400, 420)))
    out_a2, reports = run(engine, a1 + out_a1.outputs[0].token_ids + [210, 211, 212, 213])
    match = next(m for r in reports for m in r.prefix_matches.values())
    return out_a2.num_cached_tokens, match.num_loaded_tokens


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


def kv_pool_blocks(memory_bytes: int, num_layers: int, num_kv_heads: int, head_dim: int, element_bytes: int, block_size: int) -> int:
    """Lesson 12: whole blocks of ``block_size`` token slots in ``memory_bytes`` of KV pool, a slot holding
    K and V of every layer: ``memory // (block_size * 2 * layers * kv_heads * head_dim * element_bytes)``."""
    return memory_bytes // (block_size * 2 * num_layers * num_kv_heads * head_dim * element_bytes)


def fp8_read_back(x: float, scale: float, largest: float) -> float:
    """Lesson 12: what attention reads back for ``x`` stored with ``scale`` in an fp8 format whose largest
    value is ``largest``, when ``x / scale`` is beyond it or exactly representable: ``min(|x| / scale, largest)
    * scale`` with x's sign (saturation; the rounding of other values is the format's, not recomputed here)."""
    stored = min(abs(x) / scale, largest)
    return (stored if x >= 0 else -stored) * scale


def handover_expectation(pair, prompt_ids: list[int]) -> tuple[int, int]:
    """Lesson 14: hand ``prompt_ids`` from the prefill instance to the decode instance of ``pair`` (an
    ``engine.disagg_pair.DisaggPair``) and run it to its end. Returns the blocks the prefill instance
    lent (``Handover.prefill_blocks``) and the bytes the decode instance read (``Handover.num_bytes``).

    Raises:
        RuntimeError: the decode instance could not read the blocks (it recomputed the prompt).
    """
    pair.add_request(prompt_ids, max_tokens=2)
    while pair.has_unfinished():
        pair.step()
    handover = pair.handovers[-1]
    if handover.load != "loaded":
        raise RuntimeError(f"the handover ended {handover.load!r}, not loaded: the engine's numbers are not there to check")
    return len(handover.prefill_blocks), handover.num_bytes
