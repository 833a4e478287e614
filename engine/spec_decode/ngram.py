"""Prompt lookup: draft tokens found in the sequence itself (vLLM's ``NgramProposer``).

The longest suffix of the sequence, between ``prompt_lookup_min`` and ``prompt_lookup_max``
tokens, that also occurs earlier in the sequence (prompt or output) is found; the up to k tokens
that followed its earliest earlier occurrence are proposed. Summaries, edits and code that copy
spans of their prompt are where this finds long matches; open-ended text rarely is.

vLLM finds the match with KMP over the reversed tokens (``_find_longest_matched_ngram_and_propose_tokens``,
``vllm/v1/spec_decode/ngram_proposer.py``): the longest match wins, and among equally long ones
the earliest. This scan gives the same answer, written for reading.
"""

from __future__ import annotations

from collections.abc import Sequence


def propose_ngram(token_ids: Sequence[int], min_n: int, max_n: int, k: int, max_model_len: int | None = None) -> list[int]:
    """Draft tokens for one sequence by prompt lookup.

    Args:
        token_ids: the sequence so far (prompt then output).
        min_n, max_n: suffix lengths looked up, longest first (tokens).
        k: most draft tokens proposed.
        max_model_len: no draft past this length (None: no limit).

    Returns:
        0 to k token ids: what followed the earliest earlier occurrence of the longest matching
        suffix (fewer than k when that occurrence is near the end); [] when nothing matches.
    """
    tokens = list(token_ids)
    total = len(tokens)
    if max_model_len is not None:
        k = min(k, max_model_len - total)
    if k <= 0 or total < min_n + 1:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = tokens[total - n :]
        first = suffix[0]
        for start in range(total - n):  # occurrences that end before the suffix's own end
            if tokens[start] == first and tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


class NgramProposer:
    """Prompt lookup for a batch (vLLM's ``NgramProposer``), configured once.

    Args:
        min_n, max_n: ``prompt_lookup_min`` / ``prompt_lookup_max``.
        k: ``num_speculative_tokens``.
        max_model_len: the engine's longest request.
    """

    def __init__(self, min_n: int, max_n: int, k: int, max_model_len: int | None = None):
        self.min_n, self.max_n, self.k, self.max_model_len = min_n, max_n, k, max_model_len

    def propose(self, token_ids: Sequence[int], k: int | None = None) -> list[int]:
        """Up to ``k`` (default: the configured k) draft tokens for ``token_ids``."""
        return propose_ngram(token_ids, self.min_n, self.max_n, self.k if k is None else k, self.max_model_len)
