"""Greedy sampling's argmax (engine.model_executor.sampler.greedy_tokens, and the C++ one, engine.cpu.ops.greedy_tokens):
torch.argmax's answer, ties and NaN included."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.cpu import ops as cpu_ops
from engine.model_executor import sampler


@pytest.fixture(scope="module")
def kernel():
    assert cpu_ops.load_kernel(), f"the kernels did not build here: {cpu_ops.kernel_error()}"
    return cpu_ops.greedy_tokens


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


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 17),
    vocab=st.sampled_from([1, 5, 15, 16, 17, 1023, 3000, 49152]),
    levels=st.sampled_from([2, 7, 1000]),
    specials=st.lists(st.tuples(st.integers(0, 16), st.integers(0, 49151),
                                st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0, 0.0])), max_size=4),
    strided=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_the_kernel_is_argmax(kernel, rows, vocab, levels, specials, strided, seed):
    wide = torch.randint(0, levels, (rows, vocab + 3), generator=torch.Generator().manual_seed(seed)).float() - levels // 2
    logits = wide[:, 1 : 1 + vocab] if strided else wide[:, :vocab].contiguous()  # a view: rows 1 element apart more
    for r, c, value in specials:
        logits[r % rows, c % vocab] = value
    assert torch.equal(kernel(logits), logits.argmax(dim=-1))


def test_the_kernel_refuses_what_it_cannot_read_and_stays_usable(kernel):
    for bad, message in ((torch.zeros(3), "must be \\[num_seqs, vocab_size\\]"), (torch.zeros(2, 0), "vocab_size >= 1"),
                         (torch.zeros(2, 4, dtype=torch.bfloat16), "float32 CPU logits only")):
        with pytest.raises(RuntimeError, match=message):
            kernel(bad)
    assert kernel(torch.tensor([[0.0, 2.0, 2.0], [float("-inf")] * 3])).tolist() == [1, 0]


def test_sample_batch_gives_the_same_tokens_with_and_without_the_kernel(kernel):
    from engine.sampling_params import SamplingParams

    logits = torch.randn(6, 4099, generator=torch.Generator().manual_seed(3))
    params = [SamplingParams()] * 3 + [SamplingParams(temperature=0.8, seed=1)] * 3
    def gens():
        return [torch.Generator().manual_seed(i) for i in range(6)]
    assert sampler.sample_batch(logits, params, gens(), kernel=True) == sampler.sample_batch(logits, params, gens())


def test_greedy_tokens_finds_a_maximum_in_the_tail_and_keeps_the_earliest_tie():
    logits = torch.zeros(3, 2 * sampler.GREEDY_CHUNK + 5)
    logits[0, -1] = 1.0  # only in the tail (past the last full chunk)
    logits[1, 7] = logits[1, -2] = 2.0  # a tie between the first chunk and the tail: the earlier index
    logits[2, sampler.GREEDY_CHUNK + 3] = logits[2, sampler.GREEDY_CHUNK + 9] = 3.0  # a tie inside one chunk
    assert sampler.greedy_tokens(logits).tolist() == [logits.shape[1] - 1, 7, sampler.GREEDY_CHUNK + 3]
