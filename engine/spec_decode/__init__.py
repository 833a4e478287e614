"""Speculative decoding on the paged KV cache: propose k tokens, verify k + 1 positions in one
forward pass, roll back the rejected ones (Leviathan et al., 2023; Chen et al., 2023; vLLM's
``vllm/v1/spec_decode``).

- :mod:`~engine.spec_decode.config`: :class:`SpeculativeConfig` (vLLM's names).
- :mod:`~engine.spec_decode.ngram`: prompt lookup (``"ngram"``).
- :mod:`~engine.spec_decode.draft_layers`: early exit, the model's first L layers (``"draft_layers"``).
- :mod:`~engine.spec_decode.rejection_sampler`: greedy verification and rejection sampling.
"""

from engine.spec_decode.config import SPECULATIVE_METHODS, SpeculativeConfig  # no torch: engine.config imports it

__all__ = ["SPECULATIVE_METHODS", "SpeculativeConfig"]
