"""Verification of draft tokens: which of them the target model keeps, and the token after them.

The target model scores the k draft tokens ``d_1..d_k`` of a sequence in one forward pass over k + 1
positions: row i of its output is the distribution ``p_i`` of the token after ``d_1..d_i`` (row 0:
after the sequence's last verified token).

- Temperature 0 (greedy): ``d_i`` is accepted while it equals ``argmax p_{i-1}``; at the first
  mismatch the target's argmax replaces it, and if all k match, ``argmax p_k`` is the *bonus*
  token. The output is exactly greedy decoding's, one to k + 1 tokens per step.
- Temperature > 0: rejection sampling (Leviathan et al., 2023, §2.3; Chen et al., 2023,
  Algorithm 2; vLLM's ``RejectionSampler``). Draft token x, drawn from the draft distribution q,
  is accepted with probability ``min(1, p(x) / q(x))``; at the first rejection a token is drawn
  from the residual ``max(0, p - q)`` normalised, and the rest are dropped; if all are accepted, the
  bonus token is drawn from ``p_k``. Every emitted token is then distributed exactly as the
  target's ``p``, whatever q was. A proposer without a distribution (prompt lookup) proposes x
  with certainty: q is one-hot, x is accepted with probability p(x), and the residual is p
  without x.
"""

from __future__ import annotations

import torch

from engine.core.lab_impl import plug_lab_parts
from engine.sampling_params import SamplingParams


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution :func:`engine.model_executor.sampler.sample` draws from, for each row.

    Args:
        logits: ``[n, vocab_size]`` float, any device.
        params: temperature > 0, top_k, top_p as for sampling.

    Returns:
        ``[n, vocab_size]`` float32 probabilities on the CPU (rows sum to 1).
    """
    logits = logits.float().cpu() / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = probs.cumsum(-1) - probs >= params.top_p  # the most likely always stays
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.softmax(logits, dim=-1)


def verify_greedy(draft_token_ids: list[int], target_token_ids: list[int]) -> tuple[int, list[int]]:
    """Greedy verification: the longest prefix of the drafts that the target's argmax agrees with.

    Args:
        draft_token_ids: the k drafts.
        target_token_ids: the target's argmax at each of the k + 1 positions.

    Returns:
        (accepted drafts a, the a accepted tokens followed by the target's token at position a).
    """
    # BEGIN SOLUTION spec_verify
    if len(target_token_ids) != len(draft_token_ids) + 1:
        raise ValueError(f"{len(draft_token_ids)} drafts need {len(draft_token_ids) + 1} target tokens, got {len(target_token_ids)}")
    accepted = 0
    while accepted < len(draft_token_ids) and draft_token_ids[accepted] == target_token_ids[accepted]:
        accepted += 1
    return accepted, list(draft_token_ids[:accepted]) + [target_token_ids[accepted]]
    # END SOLUTION


def acceptance_probability(p_x: float, q_x: float) -> float:
    """Probability of keeping a draft token x: min(1, p(x) / q(x))."""
    return 1.0 if q_x <= 0 else min(1.0, p_x / q_x)


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """What a rejected position draws from: max(0, p - q), normalised (``[vocab_size]``).
    Where p equals q (no mass left, a rejection had probability 0) it is p."""
    residual = torch.clamp(p - q, min=0)
    total = residual.sum()
    return residual / total if total > 0 else p


def rejection_sample(draft_token_ids: list[int], target: torch.Tensor, draft: torch.Tensor | None,
                     generator: torch.Generator) -> tuple[int, list[int]]:
    """Rejection sampling of one sequence's drafts.

    Args:
        draft_token_ids: the k drafts.
        target: ``[k + 1, vocab_size]`` float32 CPU, the target's probabilities (:func:`target_probs`).
        draft: ``[k, vocab_size]`` float32 CPU, the draft's probabilities; None: each draft was
            proposed with certainty (one-hot q, as prompt lookup proposes).
        generator: the request's CPU random generator (a seed reproduces its tokens).

    Returns:
        (accepted drafts a, the emitted tokens: the a accepted drafts, then a token drawn from the
        residual at position a, or the bonus token from ``target[k]`` when all k were accepted).
    """
    k = len(draft_token_ids)
    if target.shape[0] != k + 1:
        raise ValueError(f"{k} drafts need {k + 1} target rows, got {target.shape[0]}")
    out: list[int] = []
    for i, x in enumerate(draft_token_ids):
        p = target[i]
        q = draft[i] if draft is not None else torch.nn.functional.one_hot(torch.tensor(x), p.shape[-1]).to(p.dtype)
        u = float(torch.rand((), generator=generator))
        if u < acceptance_probability(float(p[x]), float(q[x])):
            out.append(x)
            continue
        out.append(int(torch.multinomial(residual_distribution(p, q), 1, generator=generator)))
        return i, out
    out.append(int(torch.multinomial(target[k], 1, generator=generator)))
    return k, out


plug_lab_parts(globals())  # labs: a student's part in place of the engine's (engine/core/lab_impl.py)
