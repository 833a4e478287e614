"""The datasets of ``python -m engine bench-serve``, after ``vllm bench serve``'s (its
``benchmarks/datasets``): each gives a list of :class:`SampleRequest`, a prompt and the number of
tokens to generate.

- ``random``: prompts of random token ids (vLLM's ``RandomDataset``): ``--random-input-len``,
  ``--random-output-len``, spread by ``--random-range-ratio``. Sent as token ids, so each prompt
  has exactly its length.
- ``sharegpt``: the lab's ShareGPT-like lengths (engine/sim/workloads.py: lognormal prompt and
  output lengths whose means are the PagedAttention paper's ShareGPT trace, 161 and 338 tokens),
  with prompts of real English text: windows of the Python reference manual that ships with every
  CPython (``pydoc_data.topics``), cut so that the tokenizer turns each into exactly its length.
  Sent as text, as vLLM's ShareGPT dataset is; ``--sharegpt-output-len`` fixes the output length.
- ``prefix_repetition``: vLLM's ``PrefixRepetitionRandomDataset``: ``--prefix-repetition-num-prefixes``
  prefixes of ``--prefix-repetition-prefix-len`` random tokens, each followed by its requests'
  own ``--prefix-repetition-suffix-len`` random tokens, ``--prefix-repetition-output-len`` tokens
  out, shuffled. The shared prefixes are what automatic prefix caching finds. Sent as token ids.

The lengths, the token ids and the shuffles depend on the seed alone (numpy's ``default_rng``),
so two servers (the lab's and vLLM's) get the same trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DATASETS = ("random", "sharegpt", "prefix_repetition")


@dataclass
class SampleRequest:
    """One request of a dataset.

    Attributes:
        prompt: token ids (sent as they are) or text (the server tokenizes it).
        prompt_len: the prompt's tokens.
        output_len: tokens to generate (``max_tokens``).
    """

    prompt: list[int] | str
    prompt_len: int
    output_len: int

    @property
    def prompt_token_ids(self) -> list[int] | None:
        return self.prompt if isinstance(self.prompt, list) else None


def random_dataset(num_prompts: int, input_len: int, output_len: int, range_ratio: float, vocab_size: int, seed: int) -> list[SampleRequest]:
    """vLLM's random dataset: lengths uniform in ``[len * (1 - range_ratio), len * (1 + range_ratio)]``,
    prompt token ids ``(offset + i + arange(len)) % vocab_size`` from a random offset per request.

    Raises:
        ValueError: a length < 1 or a range_ratio outside [0, 1).
    """
    if input_len < 1 or output_len < 1:
        raise ValueError(f"random-input-len and random-output-len must be >= 1, got {input_len} and {output_len}")
    if not 0 <= range_ratio < 1:
        raise ValueError(f"random-range-ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)
    inputs = rng.integers(max(1, int(input_len * (1 - range_ratio))), int(input_len * (1 + range_ratio)) + 1, num_prompts)
    outputs = rng.integers(max(1, int(output_len * (1 - range_ratio))), int(output_len * (1 + range_ratio)) + 1, num_prompts)
    offsets = rng.integers(0, vocab_size, num_prompts)
    return [SampleRequest([int((offsets[i] + i + j) % vocab_size) for j in range(inputs[i])], int(inputs[i]), int(outputs[i]))
            for i in range(num_prompts)]


def prefix_repetition_dataset(num_prompts: int, prefix_len: int, suffix_len: int, num_prefixes: int, output_len: int,
                              vocab_size: int, seed: int) -> list[SampleRequest]:
    """vLLM's prefix-repetition dataset: ``num_prompts // num_prefixes`` requests per prefix (so
    ``num_prefixes * (num_prompts // num_prefixes)`` in all), each ``prefix + its own suffix``
    of random token ids, shuffled.

    Raises:
        ValueError: num_prompts < num_prefixes, num_prefixes < 1, a length < 0 (prefix, suffix)
            or < 1 (prefix + suffix, output).
    """
    if num_prefixes < 1:
        raise ValueError(f"prefix-repetition-num-prefixes must be >= 1, got {num_prefixes}")
    if num_prompts < num_prefixes:
        raise ValueError(f"num-prompts ({num_prompts}) must be >= prefix-repetition-num-prefixes ({num_prefixes})")
    if prefix_len < 0 or suffix_len < 0 or prefix_len + suffix_len < 1:
        raise ValueError(f"prefix-repetition-prefix-len and -suffix-len must be >= 0 with a sum >= 1, got {prefix_len} and {suffix_len}")
    if output_len < 1:
        raise ValueError(f"prefix-repetition-output-len must be >= 1, got {output_len}")
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(num_prefixes):
        prefix = rng.integers(0, vocab_size, prefix_len).tolist()
        for _ in range(num_prompts // num_prefixes):
            ids = prefix + rng.integers(0, vocab_size, suffix_len).tolist()
            requests.append(SampleRequest(ids, len(ids), output_len))
    order = rng.permutation(len(requests))
    return [requests[i] for i in order]


def sharegpt_dataset(num_prompts: int, tokenizer, max_model_len: int, seed: int, output_len: int | None = None) -> list[SampleRequest]:
    """ShareGPT-like requests: lengths from :func:`engine.sim.workloads.make_workload` ("sharegpt",
    capped so that prompt + output fit ``max_model_len``), prompts of real text of exactly those
    lengths (:func:`text_of_length`).

    Args:
        tokenizer: the served model's (a transformers tokenizer).
        output_len: every request's output length instead of the drawn one (vLLM's
            ``--sharegpt-output-len``); prompts are then capped to leave it room.

    Raises:
        ValueError: num_prompts < 1, or output_len outside [1, max_model_len).
    """
    from engine.sim.workloads import make_workload

    if output_len is not None and not 1 <= output_len < max_model_len:
        raise ValueError(f"sharegpt-output-len must be in [1, max_model_len = {max_model_len}), got {output_len}")
    drawn = make_workload("sharegpt", num_prompts, seed=seed, max_model_len=max_model_len)
    corpus = _corpus_ids(tokenizer)
    rng = np.random.default_rng(seed + 2)
    requests = []
    for r in drawn:
        out = output_len or r.output_len
        prompt_len = min(r.prompt_len, max_model_len - out)
        text = text_of_length(tokenizer, corpus, prompt_len, rng)
        requests.append(SampleRequest(text, prompt_len, out))
    return requests


def text_of_length(tokenizer, corpus: list[int], length: int, rng: np.random.Generator, tries: int = 50) -> str:
    """Real text that ``tokenizer`` (with its special tokens, as a server tokenizes a prompt)
    turns into exactly ``length`` tokens: a window of ``corpus`` at a random start, decoded, then
    trimmed or extended one token at a time until its re-encoding has that length (a decode and
    re-encode can merge or split tokens at the window's edges).

    Raises:
        ValueError: no window of that length re-encodes to it in ``tries`` starts (or the corpus is too short).
    """
    special = len(tokenizer("").input_ids)  # a BOS the tokenizer adds, if any
    want = length - special
    if want < 1:
        raise ValueError(f"a prompt of {length} tokens leaves no room for text after the tokenizer's {special} special tokens")
    if want + 8 > len(corpus):
        raise ValueError(f"the text corpus has {len(corpus)} tokens, too few for a prompt of {length}")
    for _ in range(tries):
        start = int(rng.integers(0, len(corpus) - want - 8))
        n = want
        for _ in range(8):
            text = tokenizer.decode(corpus[start:start + n])
            got = len(tokenizer(text).input_ids)
            if got == length:
                return text
            n += length - got
            if n < 1 or start + n > len(corpus):
                break
    raise ValueError(f"found no text of exactly {length} tokens in {tries} tries")


_CORPUS: dict[tuple, list[int]] = {}


def _corpus_ids(tokenizer) -> list[int]:
    """The corpus as token ids: the Python reference manual's topics (``pydoc_data.topics``, in every
    CPython), in sorted order, paragraphs joined by blank lines. Cached per tokenizer."""
    key = (tokenizer.name_or_path, len(tokenizer))
    if key not in _CORPUS:
        from pydoc_data.topics import topics

        text = "\n\n".join(topics[name].strip() for name in sorted(topics))
        _CORPUS[key] = tokenizer(text, add_special_tokens=False).input_ids
    return _CORPUS[key]
