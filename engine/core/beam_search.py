"""One step of beam search over a sequence group: which candidates survive, which beams finish.

Every live beam proposes its next tokens; candidates are scored by cumulative log-probability
(the beam's own plus the token's), the best ``beam_width`` that do not stop become the next
step's beams, and candidates that stop (EOS, or the length limit) among the best ``beam_width``
enter the finished hypotheses, scored ``cumulative_logprob / output_len ** length_penalty``.
The search ends when every candidate stops, or when no live beam can beat the worst of
``beam_width`` finished hypotheses any more.

This is the rule of transformers' ``generate(num_beams=k, do_sample=False)`` with its default
``early_stopping=False`` (its ``_beam_search``: top ``max(2, 1 + #eos) * k`` candidates, the early-stop
heuristic on the best running beam at the current length), so the engine's beams can be checked
against it token for token. What PagedAttention adds is memory (paper §4.4, Figure 9): a
surviving candidate *forks* its parent's block table instead of copying its KV, and a parent
with no surviving child frees its blocks at once (see ``OutputProcessor._beam_step``, ``engine/output_processor.py``).

This module decides only; it holds no blocks and runs no model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.sampling_params import BeamSearchParams
from engine.core.sequence import FinishedBeam, Sequence

if TYPE_CHECKING:  # the core imports no torch: the step works through the tensor's own methods
    import torch


@dataclass(frozen=True)
class Candidate:
    """A beam's proposed next token. ``score`` = the parent's cumulative logprob + the token's."""

    parent: Sequence
    token_id: int
    logprob: float
    score: float


@dataclass
class BeamStep:
    """What one beam-search step decided.

    Attributes:
        survivors: the next step's beams, best first (each a parent and its new token).
        finished: the group's finished hypotheses after this step, best first (at most beam_width).
        done: the search is over (the group finishes; ``finished`` is its result).
    """

    survivors: list[Candidate]
    finished: list[FinishedBeam]
    done: bool


def beam_search_step(
    beams: list[Sequence],
    logprobs: torch.Tensor,
    params: BeamSearchParams,
    finished: list[FinishedBeam],
    eos_token_ids: set[int],
    max_model_len: int,
) -> BeamStep:
    """Choose the next beams of one group.

    Args:
        beams: the live beams, all of the same length, in the order of ``logprobs``' rows.
        logprobs: ``[len(beams), vocab_size]`` float32 log-softmax of each beam's next-token logits.
        params: the request's beam-search parameters.
        finished: the finished hypotheses so far, best first.
        eos_token_ids: tokens that end a beam (unless ``params.ignore_eos``).
        max_model_len: a beam that reaches this many tokens stops.

    Returns:
        A :class:`BeamStep`.
    """
    width = params.beam_width
    eos = set() if params.ignore_eos else eos_token_ids
    vocab = logprobs.shape[1]
    scores = logprobs + logprobs.new_tensor([b.cumulative_logprob for b in beams])[:, None]
    k = min(max(2, 1 + len(eos)) * width, scores.numel())
    top_scores, top_index = scores.flatten().topk(k)
    out_len = beams[0].num_output_tokens + 1  # output length of every candidate
    at_limit = out_len >= params.max_tokens or beams[0].num_tokens + 1 >= max_model_len
    survivors, new_finished, all_stop = [], list(finished), True
    for rank, (score, index) in enumerate(zip(top_scores.tolist(), top_index.tolist())):
        parent, token = beams[index // vocab], index % vocab
        candidate = Candidate(parent, token, float(logprobs[index // vocab, token]), score)
        stops = at_limit or token in eos
        all_stop &= stops
        if not stops:
            if len(survivors) < width:
                survivors.append(candidate)
        elif rank < width:
            tokens = parent.output_token_ids + [token]
            new_finished.append(FinishedBeam(tokens, score, score / out_len**params.length_penalty))
    new_finished = sorted(new_finished, key=lambda f: -f.score)[:width]
    done = all_stop or not survivors or not _can_improve(survivors, new_finished, width, out_len, params.length_penalty)
    return BeamStep(survivors, new_finished, done)


def _can_improve(survivors: list[Candidate], finished: list[FinishedBeam], width: int, out_len: int, length_penalty: float) -> bool:
    """transformers' early-stop heuristic (``early_stopping=False``): the best live beam, scored at
    its current length, still beats the worst of ``width`` finished hypotheses."""
    if len(finished) < width:
        return True
    return survivors[0].score / out_len**length_penalty > finished[-1].score
