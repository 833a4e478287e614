"""What speculative decoding the engine runs (vLLM's ``SpeculativeConfig``), validated when built.

Two proposers need no weights beyond the model's own:

- ``"ngram"``: prompt lookup (vLLM's n-gram proposer; Saxena, "Prompt Lookup Decoding", 2023):
  the last n tokens are looked up in the prompt and the output so far, and what followed them
  is proposed.
- ``"draft_layers"``: self-speculation by early exit (LayerSkip, Elhoushi et al., 2024;
  transformers' ``assistant_early_exit``): the model's first L layers, its final norm and LM head
  draft the k tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

SPECULATIVE_METHODS = ("ngram", "draft_layers")
DEFAULT_PROMPT_LOOKUP_MIN = 1
DEFAULT_PROMPT_LOOKUP_MAX = 3


@dataclass
class SpeculativeConfig:
    """Speculative decoding settings, with vLLM's names.

    Attributes:
        method: ``"ngram"`` (prompt lookup) or ``"draft_layers"`` (early exit: the first
            ``num_draft_layers`` layers of the same model draft).
        num_speculative_tokens: k, draft tokens proposed per sequence per step; the step verifies
            k + 1 positions (the k drafts and the token after them) in one forward pass.
        prompt_lookup_min, prompt_lookup_max: ``"ngram"`` only: the shortest and longest suffix
            (tokens) looked up. vLLM's rule: when only one is given, the other equals it. Default
            1 and 3 (vLLM's default 5 suits long contexts; transformers' prompt lookup tries 2, then 1).
        num_draft_layers: ``"draft_layers"`` only: L, the layers that draft, 1 .. num_layers - 1
            (checked against the model by :meth:`verify_for_engine`).

    Raises:
        ValueError: an unknown method, k < 1, a bad lookup range, L missing or < 1 for
            ``"draft_layers"`` (each names its field).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    num_draft_layers: int | None = None

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative_config.method must be one of {', '.join(SPECULATIVE_METHODS)}; got {self.method!r}")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"speculative_config.num_speculative_tokens (k) must be an integer >= 1, got {k!r}")
        if self.method == "ngram":
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            if lo is None and hi is None:
                lo, hi = DEFAULT_PROMPT_LOOKUP_MIN, DEFAULT_PROMPT_LOOKUP_MAX
            lo, hi = (hi if lo is None else lo), (lo if hi is None else hi)
            for name, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"speculative_config.{name} must be an integer >= 1, got {value!r}")
            if lo > hi:
                raise ValueError(f"speculative_config.prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")
            self.prompt_lookup_min, self.prompt_lookup_max = lo, hi
            if self.num_draft_layers is not None:
                raise ValueError("speculative_config.num_draft_layers is for method='draft_layers', not 'ngram'")
        else:
            L = self.num_draft_layers
            if L is None:
                raise ValueError("speculative_config.num_draft_layers (L) is required with method='draft_layers'")
            if isinstance(L, bool) or not isinstance(L, int) or L < 1:
                raise ValueError(f"speculative_config.num_draft_layers (L) must be an integer >= 1, got {L!r}")
            if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
                raise ValueError("speculative_config.prompt_lookup_min/max are for method='ngram', not 'draft_layers'")

    def verify_for_engine(self, num_layers: int, num_slots: int, max_model_len: int) -> None:
        """Checks that need the built engine: the model's depth and the pool's size.

        Args:
            num_layers: the model's decoder layers.
            num_slots: token slots of the KV pool requests can use (blocks * block_size).
            max_model_len: the engine's longest request (tokens).

        Raises:
            ValueError: L outside 1 .. num_layers - 1; k + 1 (the k lookahead slots and the token
                before them) more than the pool can ever hold, or not below max_model_len.
        """
        if self.method == "draft_layers" and not 1 <= self.num_draft_layers <= num_layers - 1:
            raise ValueError(f"speculative_config.num_draft_layers (L) must be in 1 .. {num_layers - 1} for this model of "
                             f"{num_layers} layers (the draft is a strict prefix of the layers); got {self.num_draft_layers}")
        k = self.num_speculative_tokens
        if k + 1 > num_slots:
            raise ValueError(f"speculative_config.num_speculative_tokens (k={k}) needs k + 1 = {k + 1} slots per sequence "
                             f"in one step, more than the whole KV pool ({num_slots} slots) can ever hold")
        if k >= max_model_len:
            raise ValueError(f"speculative_config.num_speculative_tokens (k={k}) must be below max_model_len ({max_model_len})")
