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
