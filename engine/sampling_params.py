"""How one request wants its tokens chosen and when it stops (vLLM's ``SamplingParams``)."""

from __future__ import annotations

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
        stop: strings that end the request; the text is cut before the stop string.
        stop_token_ids: token ids that end the request (besides the model's EOS).
        ignore_eos: keep going past EOS (used by benchmarks, so every request runs max_tokens).

    Raises:
        ValueError: on any field out of range, naming the field.
    """

    max_tokens: int = 64
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {self.temperature!r}")
        if self.temperature < _SAMPLING_EPS:
            self.temperature = 0.0  # dividing logits by a tiny temperature overflows; it means greedy anyway
        if not isinstance(self.top_p, (int, float)) or isinstance(self.top_p, bool):
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (all), 0 (all) or a positive integer, got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63):
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
