"""When speculative decoding pays: the step-time model's prediction against batch size.

A plain decode step of B sequences runs B query tokens through the model; a speculative step runs
B * (k + 1) (each sequence's newest token and its k drafts, verified in one pass) and yields
``expected_tokens_per_step(alpha, k)`` tokens per sequence instead of 1. While the step is
memory-bound (reading the weights dominates: small B on a GPU), k + 1 query tokens cost about what
one does, and the speed-up approaches the expected tokens per step. Once B * (k + 1) tokens reach
the compute roof, each extra query token costs its FLOPs, the rejected drafts' work is wasted,
and speculation loses (Leviathan et al., 2023, §3.3-3.4; vLLM's docs on speculative decoding:
"most useful in memory-bound, low-QPS settings").

The draft's own cost is ``draft_cost`` per draft token, a share of a plain decode step: 0 for
prompt lookup (a search on the host), about L / num_layers for early exit with L layers.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.sim.cost_model import CostModel, StepShape, expected_tokens_per_step, speculative_step_shape


@dataclass(frozen=True)
class SpeculativePrediction:
    """One batch size's prediction.

    Attributes:
        batch: sequences decoding together.
        plain_step_s, spec_step_s: seconds of one plain decode step, and of one speculative step
            (drafting + verification).
        tokens_per_step: expected tokens per sequence per speculative step.
        plain_tokens_per_s, spec_tokens_per_s: output tokens per second of the whole batch.
        speedup: spec_tokens_per_s / plain_tokens_per_s.
    """

    batch: int
    plain_step_s: float
    spec_step_s: float
    tokens_per_step: float
    plain_tokens_per_s: float
    spec_tokens_per_s: float

    @property
    def speedup(self) -> float:
        return self.spec_tokens_per_s / self.plain_tokens_per_s


def alpha_from_mean_accepted_length(mean_accepted_length: float, k: int) -> float:
    """The per-draft acceptance probability α that gives a measured mean accepted length (tokens
    per verification) with k drafts: the inverse of :func:`expected_tokens_per_step`, found by
    bisection (it rises with α from 1 at α = 0 to k + 1 at α = 1).

    This is the α of Leviathan et al.'s formula. It is not the engine's ``acceptance_rate``
    (accepted / proposed, vLLM's draft acceptance rate): a draft after the first rejection is
    never judged, so accepted / proposed is lower and gives exactly 1 + k · rate tokens per step.

    Raises:
        ValueError: k < 1 or a mean accepted length outside [1, k + 1].
    """
    if k < 1:
        raise ValueError(f"k must be >= 1 draft token, got {k}")
    if not 1 <= mean_accepted_length <= k + 1:
        raise ValueError(f"mean accepted length must be in [1, {k + 1}] with k = {k}, got {mean_accepted_length}")
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if expected_tokens_per_step(mid, k) < mean_accepted_length:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def predict_speedup(cost: CostModel, batches: list[int], context_len: int, alpha: float, k: int,
                    draft_cost: float = 0.0, block_size: int | None = 16) -> list[SpeculativePrediction]:
    """Predicted plain and speculative throughput at each batch size.

    Args:
        cost: the step-time model (a preset, or this machine's fit from ``python -m engine calibrate``).
        batches: batch sizes (sequences).
        context_len: tokens cached per sequence (the decode's context).
        alpha: acceptance rate of one draft token, 0..1 (measured by the engine, or assumed).
        k: draft tokens per step.
        draft_cost: cost of drafting one token as a share of a plain decode step (0: prompt lookup).
        block_size: paged block size (None: a contiguous kernel).

    Raises:
        ValueError: a batch < 1, context_len < 1, alpha outside [0, 1], k < 1 or draft_cost < 0.
    """
    if any(b < 1 for b in batches) or context_len < 1 or k < 1 or draft_cost < 0:
        raise ValueError("batches and context_len must be >= 1, k >= 1 and draft_cost >= 0")
    expected = expected_tokens_per_step(alpha, k)
    out = []
    for batch in batches:
        plain = cost.step_time(StepShape.of_batch([], [context_len + 1] * batch, block_size))
        spec = cost.step_time(speculative_step_shape(batch, context_len, k, block_size)) + k * draft_cost * plain
        out.append(SpeculativePrediction(batch, plain, spec, expected, batch / plain, batch * expected / spec))
    return out


def breakeven_batch(predictions: list[SpeculativePrediction]) -> int | None:
    """The smallest batch size at which speculation is slower than plain decoding (None: never, in these)."""
    return next((p.batch for p in sorted(predictions, key=lambda p: p.batch) if p.speedup < 1), None)
