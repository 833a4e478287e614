"""Choosing the next token from logits: greedy, or temperature with top-k / top-p, seeded per request."""

from __future__ import annotations

import torch

from engine.sampling_params import SamplingParams


def sample_batch(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]) -> list[int]:
    """One token per row of ``logits`` ``[num_seqs, vocab_size]``; greedy rows share one argmax."""
    # max(dim).indices is argmax (the first of equal maxima, as documented for both), ~1.5x faster on CPU.
    greedy = logits.max(dim=-1).indices.tolist()
    return [greedy[i] if p.greedy else sample(logits[i], p, g) for i, (p, g) in enumerate(zip(params, generators))]


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """Pick one token id.

    Args:
        logits: ``[vocab_size]`` fp32, on any device.
        params: the request's sampling rules (temperature 0 = argmax).
        generator: the request's own CPU random generator, so a seed reproduces its tokens
            whatever else runs in the batch.
    """
    if params.greedy:
        return int(torch.argmax(logits))
    logits = logits.float().cpu() / params.temperature
    if params.top_k > 0:
        kth = torch.topk(logits, min(params.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # Drop a token once the tokens before it already reach top_p; the most likely always stays.
        drop = cumulative - torch.softmax(sorted_logits, dim=-1) >= params.top_p
        logits[order[drop]] = float("-inf")
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
