"""Greedy sampling's argmax (engine.sampler.greedy_tokens): torch.argmax's answer, ties and NaN included."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import sampler


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 17),
    vocab=st.sampled_from([1, 5, 1023, 1024, 1025, 3000, 4096, 49152]),
    levels=st.sampled_from([2, 7, 1000]),  # few distinct values: ties within and across chunks
    specials=st.lists(st.tuples(st.integers(0, 16), st.integers(0, 49151), st.sampled_from([float("nan"), float("inf"), float("-inf")])), max_size=4),
    seed=st.integers(0, 2**31 - 1),
)
def test_greedy_tokens_is_argmax(rows, vocab, levels, specials, seed):
    logits = torch.randint(0, levels, (rows, vocab), generator=torch.Generator().manual_seed(seed)).float()
    for r, c, value in specials:
        logits[r % rows, c % vocab] = value
    assert torch.equal(sampler.greedy_tokens(logits), logits.argmax(dim=-1))


def test_greedy_tokens_finds_a_maximum_in_the_tail_and_keeps_the_earliest_tie():
    logits = torch.zeros(3, 2 * sampler.GREEDY_CHUNK + 5)
    logits[0, -1] = 1.0  # only in the tail (past the last full chunk)
    logits[1, 7] = logits[1, -2] = 2.0  # a tie between the first chunk and the tail: the earlier index
    logits[2, sampler.GREEDY_CHUNK + 3] = logits[2, sampler.GREEDY_CHUNK + 9] = 3.0  # a tie inside one chunk
    assert sampler.greedy_tokens(logits).tolist() == [logits.shape[1] - 1, 7, sampler.GREEDY_CHUNK + 3]
