"""How one request wants its tokens chosen and when it stops (vLLM's ``SamplingParams``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

_SAMPLING_EPS = 1e-5  # temperatures below this are treated as greedy, as vLLM does


@dataclass
class SamplingParams:
    """Sampling and stopping rules of one request.

    Attributes:
        max_tokens: most new tokens to generate (>= 1).
        temperature: 0 = greedy (argmax); otherwise logits are divided by it before sampling.
        top_k: keep the k most likely tokens (-1 or 0 = all).
        top_p: keep the smallest set of tokens whose probability sums to at least top_p, in (0, 1].
        seed: seeds this request's sampling; None = derived from the engine seed and the request id.
        stop: strings that end the request (a string, a list of strings, or None = none); the
            text is cut before the stop string.
        stop_token_ids: token ids that end the request (besides the model's EOS); None = none.
            The engine checks them against the vocabulary when the request is added.
        ignore_eos: keep going past EOS (used by benchmarks, so every request runs max_tokens).
        n: parallel sampling: independent samples of the one prompt (>= 1). The prompt is prefilled
            once and shared by all n through their block tables (paper §4.4). Sample i is seeded
            with :func:`sample_seed` (seed, i): sample 0 is what n = 1 gives with the same seed, and
            the same seed gives the same n samples.
        logprobs: vLLM's name: 0 = keep each chosen token's log-probability (``CompletionOutput.logprobs``,
            the log-softmax of the step's logits); None (default) = none (the step skips the log-softmax).

    Raises:
        ValueError: on any field of the wrong type or out of range, naming the field (bools are
            not integers here, and temperatures must be finite).
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | str | None = field(default_factory=list)
    stop_token_ids: list[int] | None = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1
    logprobs: int | None = None

    def __post_init__(self) -> None:
        self.verify()

    def verify(self) -> None:
        """Check every field (again: the engine calls it when a request is added, so a field changed
        after construction is caught too); normalises ``stop`` and ``stop_token_ids`` to lists.

        Raises:
            ValueError: naming the first bad field.
        """
        if self.logprobs not in (None, 0) or isinstance(self.logprobs, bool):
            raise ValueError(f"logprobs must be None or 0 (the chosen token's log-probability; more are not kept), got {self.logprobs!r}")
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n (parallel samples) must be an integer >= 1, got {self.n!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_number(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature!r}")
        if self.temperature < _SAMPLING_EPS:
            self.temperature = 0.0  # dividing logits by a tiny temperature overflows; it means greedy anyway
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (all), 0 (all) or a positive integer, got {self.top_k!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, (list, tuple)) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got {self.stop!r}")
        self.stop = list(self.stop)
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if not isinstance(self.stop_token_ids, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be a list of token ids (integers >= 0), got {self.stop_token_ids!r}")
        self.stop_token_ids = list(self.stop_token_ids)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def sample_seed(seed: int, index: int) -> int:
    """Seed of sample ``index`` of a request seeded ``seed``: ``seed`` itself for sample 0, and a
    different, fixed value for each further sample (a golden-ratio stride, modulo 2**63)."""
    return (seed + index * 0x9E3779B97F4A7C15) % 2**63


@dataclass
class BeamSearchParams:
    """Beam search inside the engine (vLLM's ``BeamSearchParams``): each step every live beam
    proposes its best next tokens, the ``beam_width`` best candidates by cumulative log-probability
    survive, and a surviving child *forks* its parent's block table (paper §4.4, Figure 9).

    Attributes:
        beam_width: beams kept per step (>= 1).
        max_tokens: most new tokens per beam (>= 1).
        length_penalty: a finished beam's score is cumulative logprob / (output tokens ** length_penalty),
            as transformers' ``generate(num_beams=...)`` scores it.
        ignore_eos: keep beams going past EOS.
        temperature: must be 0: this beam search is deterministic (a temperature > 0 is refused).

    Raises:
        ValueError: on any field out of range, naming the field.
    """

    beam_width: int
    max_tokens: int = 64
    length_penalty: float = 1.0
    ignore_eos: bool = False
    temperature: float = 0.0

    def __post_init__(self) -> None:
        self.verify()

    def verify(self) -> None:
        """Check every field (the engine calls it again when a request is added).

        Raises:
            ValueError: naming the first bad field.
        """
        if not _is_int(self.beam_width) or self.beam_width < 1:
            raise ValueError(f"beam_width must be an integer >= 1, got {self.beam_width!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not _is_number(self.length_penalty) or not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be a finite number, got {self.length_penalty!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if not _is_number(self.temperature):
            raise ValueError(f"temperature must be a number (0), got {self.temperature!r}")
        if self.temperature != 0:
            raise ValueError(f"beam search here is deterministic: temperature must be 0, got {self.temperature!r} "
                             "(use SamplingParams(n=...) for random samples)")

    def stopping_params(self) -> SamplingParams:
        """The per-beam stopping rules as SamplingParams (greedy; the beam search chooses tokens)."""
        return SamplingParams(max_tokens=self.max_tokens, ignore_eos=self.ignore_eos)
