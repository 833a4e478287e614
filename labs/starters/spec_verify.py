"""Lab spec_verify: Speculative decoding: greedy verification / 投机解码：贪心验证.

Keep the longest prefix of the draft tokens that the target model's argmax agrees with, then the
target's own token at the first disagreement (or the bonus token after all k).

保留草稿 token 中与目标模型 argmax 一致的最长前缀，再接上第一个不一致位置目标模型自己的 token（全部 k 个草稿都被接受时，再加上额外 token）。

Your part plugs into the engine in place of its own, in engine/spec_decode/rejection_sampler.py (the engine module's names are in
scope here). Grade it in your copy of the starters (labs/README.md), where the labs build on
each other:

    python -m lessons grade spec_verify --impl labs/mine

Cut by `python -m lessons labs build` from engine/spec_decode/rejection_sampler.py; work on a copy.

The module engine/spec_decode/rejection_sampler.py, for context:

Verification of draft tokens: which of them the target model keeps, and the token after them.

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
from engine.sampling_params import SamplingParams

LAB = "spec_verify"  # the lab whose parts this file holds


def verify_greedy(draft_token_ids: list[int], target_token_ids: list[int]) -> tuple[int, list[int]]:
    """Greedy verification: the longest prefix of the drafts that the target's argmax agrees with.

    Args:
        draft_token_ids: the k drafts.
        target_token_ids: the target's argmax at each of the k + 1 positions.

    Returns:
        (accepted drafts a, the a accepted tokens followed by the target's token at position a).
    """
    # TODO(spec_verify): write this part (see the docstring and labs/README.md)
    raise NotImplementedError("lab spec_verify: verify_greedy")
